"""Times as the API writes them (ISO 8601 in UTC with a ``Z``) and as it
takes them (any offset, stored in UTC)."""

from __future__ import annotations

from datetime import UTC, datetime

from core.errors import Invalid


def iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def as_utc(moment: datetime | None, name: str) -> datetime | None:
    """A time a caller gave, in UTC: without an offset it is UTC, never the
    server's zone; with one it is converted here. PostgreSQL refuses an
    offset beyond 15:59 that Python accepts (up to 23:59), so the value is
    never sent with the caller's offset; one that leaves the years 1-9999
    on the way is 400 ``invalid``, naming the field."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise Invalid(f"{name}: {moment.isoformat()} is out of range") from None
