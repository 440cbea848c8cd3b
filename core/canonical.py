"""The one canonical JSON encoding: sorted keys, no spaces, UTF-8 as is.

Every hash and every byte cap of a JSON value is taken over these bytes: a
ticket's input hash and caps (tickets.admission), a result's cap and its
artifact address, an outcome's digest and a late result's hash
(runtime.turns.finish), an inspection snapshot's hash
(recovery.selectors)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def canonical_json(value: Any, *, default: Callable[[Any], Any] | None = None) -> bytes:
    """One byte string per JSON value."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=default
    ).encode()
