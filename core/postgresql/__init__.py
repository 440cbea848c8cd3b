"""Django's PostgreSQL backend with a health check that costs no round trip
(``base.DatabaseWrapper.is_usable``); ``DATABASES["default"]["ENGINE"]``
names this package (config/settings.py)."""
