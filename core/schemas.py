"""The API's schema bases, shared by every app's routes.

- ``Strict``: request bodies. An unknown field is 422, never silently
  dropped. ``StrictTyped`` also refuses a number or flag sent as a string
  (``"5"``, ``"true"``).
- ``Out``: response bodies. Every field a client gets is declared (so
  ``/api/v1/openapi.json`` describes it and generated clients are typed);
  types are the JSON ones the payload functions already produce, so a body
  is byte-for-byte what it was (``int | float`` keeps an integer an
  integer). ``extra="allow"``: a field added to a payload before its schema
  still reaches the client (API.md: fields are added, never removed).
"""

from __future__ import annotations

from ninja import Schema
from pydantic import ConfigDict


class Strict(Schema):
    model_config = ConfigDict(extra="forbid")


class StrictTyped(Strict):
    model_config = ConfigDict(extra="forbid", strict=True)


class Out(Schema):
    model_config = ConfigDict(extra="allow")
