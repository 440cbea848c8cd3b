"""Time-ordered ids: UUIDv7 keeps new rows at the right edge of the index."""

import uuid

import uuid6


def new_id() -> uuid.UUID:
    return uuid.UUID(int=uuid6.uuid7().int)
