"""Times as the API writes them: ISO 8601 in UTC with a ``Z``."""

from __future__ import annotations

from datetime import datetime


def iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None
