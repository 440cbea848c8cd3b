"""Input that PostgreSQL cannot store, or that is nested past the one depth
bound, refused at the edge as 400 ``invalid`` naming the field (API.md
"Errors"), once for every route; and the same walk for what runners return
(``runtime.runners.storable``).

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

The depth bound, ``TICKET_MAX_JSON_DEPTH`` (an object or an array is one
level, a scalar none), holds for every JSON value that enters: each field
of a request body (a ticket's input, its requester, its ``return_to``; a
turn's result; an MCP tool's arguments), and each part of a runner's reply
or an agent's output. It is set far below what the worker itself can carry
(pickling a turn to its process and back, ``dataclasses.asdict`` of an
outcome, ``json`` into PostgreSQL: each of them fails somewhere past 400
levels, less the worker's own stack), so nothing admitted can crash the
turn that runs it (tests/config/test_inputs.py measures the margin).
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from ninja.parser import Parser

from core.errors import Invalid

# In Python's str a NUL is "\x00" and a lone surrogate one code point in
# U+D800..U+DFFF (json.loads makes one from an unpaired "\udc00" escape).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class Unstorable(Invalid):
    """400 ``invalid`` with ``field``: the dotted path of what was refused."""

    def __init__(
        self, field: str, what: str, *, why: str = "which the ledger cannot store"
    ) -> None:
        super().__init__(f"{field} {what}, {why}", field=field)


def max_depth() -> int:
    """The nesting bound of every JSON value that enters (module docstring)."""
    return settings.TICKET_MAX_JSON_DEPTH


def _too_deep(field: str, limit: int) -> Unstorable:
    return Unstorable(
        field,
        f"is nested more than {limit} levels deep",
        why="past the bound every value has (TICKET_MAX_JSON_DEPTH)",
    )


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


# An int json.dumps cannot write (Python's limit on an int's decimal digits,
# 4300 by default): log2(10) bits a digit.
_INT_MAX_BITS = int((sys.get_int_max_str_digits() or 1_000_000) * 3.3219)


def _unstorable_scalar(item: Any) -> str | None:
    kind = type(item)
    if kind is str:
        return text_problem(item)
    if kind is _NonFinite:
        return f"is {item.text}, not a finite number"
    if kind is float and not math.isfinite(item):
        return f"is {item}, not a finite number"
    if kind is int:
        return None if item.bit_length() < _INT_MAX_BITS else "is too long a number"
    if kind is bool or item is None:
        return None
    # What a python runner returns is not parsed JSON: a subclass of a JSON
    # type is written as that type; anything else json.dumps refuses.
    if isinstance(item, str):
        return text_problem(item)
    if isinstance(item, float):
        return None if math.isfinite(item) else f"is {item}, not a finite number"
    if isinstance(item, int):
        return None
    return f"is a {kind.__name__}, not a JSON value"


def check_value(value: Any, *, path: str = "", depth: int | None = None) -> None:
    """Raise ``Unstorable`` for the first NUL, lone surrogate, non-finite
    number or value that is not JSON in ``value`` (strings, keys, numbers,
    at any depth); with ``depth``, for nesting more than ``depth`` levels
    deep too (``value`` itself, an object or array, is the first level),
    naming ``path``.

    Iterative, not recursive: a deeply nested body that json.loads accepted
    must not end in a RecursionError here. Containers are pushed, scalars
    checked in place, and a field's name is built only for the one refused
    (a 64 KiB body has thousands of values: eager names tripled the cost).
    """
    search = _UNSTORABLE.search
    isfinite = math.isfinite
    limit = sys.maxsize if depth is None else depth
    stack: list[tuple[Any, tuple | None, int]] = [(value, None, 1)]
    while stack:
        item, trail, level = stack.pop()
        kind = type(item)
        if kind is dict:
            children = item.items()
        elif kind is list:
            children = enumerate(item)
        elif isinstance(item, dict):  # not parsed JSON: what a python runner returned
            children = item.items()
        elif isinstance(item, list | tuple):
            children = enumerate(item)
        else:
            problem = _unstorable_scalar(item)
            if problem:
                raise Unstorable(_field(trail, path), problem)
            continue
        if level > limit:
            raise _too_deep(path or "body", limit)
        for key, child in children:
            if type(key) is str:
                if search(key):
                    problem = f"is a key that {text_problem(key)}"
                    raise Unstorable(_field((trail, key), path), problem)
            else:
                _check_key(key, trail, path)
            kind = type(child)
            if kind is str:
                if search(child):
                    raise Unstorable(_field((trail, key), path), text_problem(child))
            elif kind is int:
                if child.bit_length() >= _INT_MAX_BITS:
                    raise Unstorable(_field((trail, key), path), "is too long a number")
            elif kind is float:
                if not isfinite(child):
                    raise Unstorable(_field((trail, key), path), f"is {child}, not a finite number")
            elif kind is not bool and child is not None:
                stack.append((child, (trail, key), level + 1))


def _check_key(key: Any, trail: tuple | None, path: str) -> None:
    """A key that is not exactly a str: json.dumps writes a str subclass,
    an int, a float, a bool or None as a key, and refuses anything else."""
    if isinstance(key, str):
        if _UNSTORABLE.search(key):
            problem = f"is a key that {text_problem(key)}"
            raise Unstorable(_field((trail, key), path), problem)
    elif not isinstance(key, int | float) and key is not None:
        raise Unstorable(_field(trail, path), f"has a key that is a {type(key).__name__}")


def check_fields(value: Any, *, path: str = "") -> None:
    """``check_value`` of a body (or a tool's arguments) with the depth bound
    on each of its fields, the field named when it is past it."""
    limit = max_depth()
    if type(value) is not dict:
        check_value(value, path=path, depth=limit)
        return
    for key, child in value.items():
        problem = text_problem(key) if type(key) is str else None
        if problem:
            raise Unstorable(join(path, key), f"is a key that {problem}")
        check_value(child, path=join(path, key), depth=limit)


def _parse_float(text: str) -> float | _NonFinite:
    number = float(text)
    return number if math.isfinite(number) else _NonFinite(text)


def _parse_constant(text: str) -> _NonFinite:
    return _NonFinite(text)  # NaN, Infinity, -Infinity: not JSON, and not storable


def loads(raw: bytes | str, *, bounded: bool = False) -> Any:
    """``json.loads`` that refuses, as ``Invalid`` saying why, what the
    ledger cannot store or what is not JSON; ``bounded``: and each field
    nested past the depth bound (``check_fields``)."""
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
    if bounded:
        check_fields(value)
    else:
        check_value(value)
    return value


def loads_reply(raw: bytes | str) -> Any:
    """A runner's reply (a command's stdout, an http agent's body) as JSON,
    unchecked: ``ValueError`` when it is not JSON, ``RecursionError`` when
    json cannot read its nesting; a non-finite number stays marked for
    ``check_value`` (the runtime's ``storable``) to name."""
    return json.loads(raw, parse_float=_parse_float, parse_constant=_parse_constant)


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
        return loads(request.body, bounded=True)
