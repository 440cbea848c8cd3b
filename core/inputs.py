"""Input that PostgreSQL cannot store, refused at the edge as 400 ``invalid``
naming the field (API.md "Errors"), once for every route.

PostgreSQL refuses three things a JSON request can carry, and each used to
reach a query and fail there as a 500:

- a NUL character (``\\u0000``) anywhere in text: ``text`` columns and
  ``jsonb`` strings and keys cannot hold it (psycopg refuses it before it
  leaves the process);
- a lone UTF-16 surrogate (``\\udc00``): not Unicode, so it cannot be
  encoded as UTF-8 at all (``UntranslatableCharacter``);
- a non-finite number (``NaN``, ``Infinity``, or ``1e400``, which Python
  reads as ``inf``): ``jsonb`` has no such numbers.

Bodies are checked by ``JsonParser`` (ninja's parser, config/api.py) as
they are parsed; the path, the query string, headers and console form fields
by ``InputGuardMiddleware`` (core/middleware.py) before anything is routed.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from django.http import HttpRequest
from ninja.parser import Parser

from core.errors import Invalid

# In Python's str a NUL is "\x00" and a lone surrogate one code point in
# U+D800..U+DFFF (json.loads makes one from an unpaired "\udc00" escape).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class Unstorable(Invalid):
    """400 ``invalid`` with ``field``: the dotted path of what was refused."""

    def __init__(self, field: str, what: str) -> None:
        super().__init__(f"{field} {what}, which the ledger cannot store", field=field)


class _NonFinite:
    """Stands in for NaN, Infinity or an overflowing float while parsing, so
    the walk after parsing can say where it was."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def text_problem(text: str) -> str | None:
    """What makes ``text`` unstorable, in words, or None."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "contains a NUL character (\\u0000)"
    return f"contains a lone surrogate (\\u{ord(found.group()):04x}), which is not Unicode"


def shown(key: str) -> str:
    """A key as it may appear in a field name: JSON-escaped, so a NUL or a
    surrogate shows as ``\\u0000`` (and the answer stays valid UTF-8)."""
    return json.dumps(key)[1:-1]


def join(path: str, part: str | int) -> str:
    part = shown(part) if isinstance(part, str) else str(part)
    return f"{path}.{part}" if path else part


def _field(trail: tuple | None, root: str) -> str:
    """The dotted name of a place in the walk: ``trail`` is a linked list
    ``(parent trail, key or index)``, turned into a name only on failure."""
    parts = []
    while trail is not None:
        trail, part = trail
        parts.append(part)
    name = root
    for part in reversed(parts):
        name = join(name, part)
    return name or "body"


def _unstorable_scalar(item: Any) -> str | None:
    kind = type(item)
    if kind is str:
        return text_problem(item)
    if kind is _NonFinite:
        return f"is {item.text}, not a finite number"
    if kind is float and not math.isfinite(item):
        return f"is {item}, not a finite number"
    return None


def check_value(value: Any, *, path: str = "") -> None:
    """Raise ``Unstorable`` for the first NUL, lone surrogate or non-finite
    number in ``value`` (strings, keys, numbers, at any depth).

    Iterative, not recursive: a deeply nested body that json.loads accepted
    must not end in a RecursionError here. Containers are pushed, scalars
    checked in place, and a field's name is built only for the one refused
    (a 64 KiB body has thousands of values: eager names tripled the cost).
    """
    search = _UNSTORABLE.search
    stack: list[tuple[Any, tuple | None]] = [(value, None)]
    while stack:
        item, trail = stack.pop()
        if type(item) is dict:
            children = item.items()
        elif type(item) is list:
            children = enumerate(item)
        else:
            problem = _unstorable_scalar(item)
            if problem:
                raise Unstorable(_field(trail, path), problem)
            continue
        for key, child in children:
            if type(key) is str and search(key):
                raise Unstorable(_field((trail, key), path), f"is a key that {text_problem(key)}")
            kind = type(child)
            if kind is dict or kind is list:
                stack.append((child, (trail, key)))
            elif kind is str:
                if search(child):
                    raise Unstorable(_field((trail, key), path), text_problem(child))
            elif kind is _NonFinite or kind is float:
                problem = _unstorable_scalar(child)
                if problem:
                    raise Unstorable(_field((trail, key), path), problem)


def _parse_float(text: str) -> float | _NonFinite:
    number = float(text)
    return number if math.isfinite(number) else _NonFinite(text)


def _parse_constant(text: str) -> _NonFinite:
    return _NonFinite(text)  # NaN, Infinity, -Infinity: not JSON, and not storable


def loads(raw: bytes | str) -> Any:
    """``json.loads`` that refuses, as ``Invalid`` saying why, what the
    ledger cannot store or what is not JSON."""
    try:
        value = json.loads(raw, parse_float=_parse_float, parse_constant=_parse_constant)
    except json.JSONDecodeError as exc:
        raise Invalid(
            f"the body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except UnicodeDecodeError:
        raise Invalid("the body is not valid UTF-8") from None
    except RecursionError:
        raise Invalid("the body is nested too deeply") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python reads
        raise Invalid(f"the body is not valid JSON: {exc}") from None
    check_value(value)
    return value


def is_json(content_type: str) -> bool:
    """``application/json`` or a ``+json`` type (parameters such as
    ``charset`` are already split off by Django)."""
    content_type = content_type.lower()
    return content_type == "application/json" or (
        content_type.startswith("application/") and content_type.endswith("+json")
    )


class JsonParser(Parser):
    """ninja's body parser for every route: JSON only, and nothing the ledger
    cannot store. ninja wraps what a parser raises in a 400 HttpError; the
    handler in config/api.py answers with the ``Invalid`` it carries."""

    def parse_body(self, request: HttpRequest) -> Any:
        if not is_json(request.content_type or ""):
            raise Invalid(
                "the body must be JSON sent as Content-Type: application/json "
                f"(got {request.content_type or 'no Content-Type'!r})"
            )
        return loads(request.body)
