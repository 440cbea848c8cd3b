"""Dates as the console prints them (console/templatetags/consoletags.py
``utc``): ISO-like, to the second, in UTC with a ``Z``. Django's English
formats ("Dec. 2, 2026, 7:27 a.m.") are what the admin and any template
that prints a datetime without a format would show otherwise. ``TIME_ZONE``
is fixed to UTC (config/settings.py), so the ``Z`` is true. Input formats
are Django's own (this module names none)."""

DATETIME_FORMAT = r"Y-m-d H:i:s\Z"
SHORT_DATETIME_FORMAT = r"Y-m-d H:i\Z"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = r"H:i:s\Z"
