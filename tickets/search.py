"""Search inside a ticket's input and result by key and value.

A term is ``input.<path>:<value>`` or ``result.<path>:<value>``; several
terms (separated by spaces) must all hold. The path is dotted keys into the
JSON objects (a key with a dot, a colon, a space or a quote is written as a
JSON string: ``input."a.b":1``). The value is compared as one JSON scalar:
a JSON number (``42``, ``-1.5``, ``1e3``), ``true``, ``false`` or ``null``,
a quoted JSON string (``"42"``, ``"two words"``), else the bare text as a
string (``input.customer:acme``).

A term is the containment ``input @> '{"customer": 42}'``, which the GIN
``jsonb_path_ops`` indexes ``ticket_input_search_idx`` and
``ticket_result_search_idx`` serve for staff; for anyone else (and for an
endpoint filter) ``ticket_search_scoped_idx`` serves it among the tickets
the caller may see (``within``: the same document under the ticket's
submitter's and its endpoint's name). The indexes hold settled tickets
only, so an admission writes no entry in them; the tickets in flight are
checked row by row (``in_flight``), so a queued ticket is found by its
text from its admission on. Containment walks objects only: a path
does not reach into an array's elements, and a value matches the value at
its path exactly (``42`` matches ``42`` and ``42.0``, not ``"42"``).
Only what the ticket row holds is searched: a result stored as an artifact
is found by what the row keeps of it, not by the artifact's content.

The API's ``GET /tickets?search=`` takes terms only; the console's search
box takes terms beside the id, dedupe key or trace it already finds
(``split_query``). Bad syntax is 400 ``invalid_search``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from django.db import connection
from django.db.models import (
    BooleanField,
    ExpressionWrapper,
    F,
    Func,
    JSONField,
    Q,
    QuerySet,
    Value,
)
from django.db.models.fields.json import DataContains
from django.db.models.functions import Cast

from core.errors import InvalidSearch
from core.inputs import text_problem

from .models import SETTLED_STATES

COLUMNS = ("input", "result")
MAX_TERMS = 8
MAX_DEPTH = 16
MAX_CHARS = 2000

# A JSON number exactly: "007", "+5", "1." and ".5" are text.
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None}
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Term:
    column: str  # "input" or "result"
    path: tuple[str, ...]
    # The value as JSON text: a number keeps the digits as typed, so a
    # long decimal is compared exactly, not through a float.
    value: str

    def document(self) -> str:
        """The containment document: ``{"a": {"b": <value>}}`` for ``a.b``."""
        text = self.value
        for key in reversed(self.path):
            text = "{" + json.dumps(key, ensure_ascii=False) + ":" + text + "}"
        return text

    def q(self) -> Q:
        return Q(**{f"{self.column}__contains": Cast(Value(self.document()), JSONField())})

    def scoped_q(self, scope: str) -> Q:
        """The term among one scope's tickets (``scope``: ``s<user id>``, a
        submitter's, or ``e<endpoint id>``, an endpoint's), by the scoped
        index: ``{"s42": {"input": <document>}}``."""
        doc = (
            "{" + json.dumps(scope) + ":{" + json.dumps(self.column) + ":" + self.document() + "}}"
        )
        return Q(DataContains(SCOPED, Cast(Value(doc), JSONField())))

    def __str__(self) -> str:
        keys = ".".join(k if _bare_key(k) else json.dumps(k, ensure_ascii=False) for k in self.path)
        return f"{self.column}.{keys}:{self.value}"


def _bare_key(key: str) -> bool:
    return bool(key) and not any(c in key for c in '.:"') and not any(c.isspace() for c in key)


def _fail(token: str, why: str) -> InvalidSearch:
    shown = token if len(token) <= 80 else token[:77] + "..."
    return InvalidSearch(
        f"search term {shown!r}: {why} (a term is input.<key>:<value> or result.<key>:<value>)",
        field="search",
    )


def is_term(token: str) -> bool:
    """Whether a token is meant as a term: it starts with ``input`` or
    ``result`` and a dot or colon (a bad one is an error, not a dedupe key)."""
    return token.startswith(("input.", "input:", "result.", "result:"))


def tokens(text: str) -> list[str]:
    """``text`` split at whitespace outside double quotes (a backslash
    escapes the next character inside them). An unterminated quote runs to
    the end: the term's parser says so."""
    out: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for char in text:
        if quoted:
            current.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char.isspace():
            if current:
                out.append("".join(current))
                current = []
        else:
            current.append(char)
            quoted = char == '"'
    if current:
        out.append("".join(current))
    return out


def _quoted(token: str, pos: int, what: str) -> tuple[str, int]:
    try:
        value, end = _DECODER.raw_decode(token, pos)
    except ValueError:
        raise _fail(token, f"the quoted {what} is not a JSON string") from None
    if not isinstance(value, str):  # raw_decode at '"' reads a string; guard anyway
        raise _fail(token, f"the quoted {what} is not a JSON string")
    problem = text_problem(value)
    if problem:
        raise _fail(token, f"the {what} {problem}")
    return value, end


def parse_term(token: str) -> Term:
    column, _, rest = token.partition(".")
    if column not in COLUMNS or not _ or not rest:
        raise _fail(token, "name a key after the dot")
    pos = len(column) + 1
    path: list[str] = []
    while True:
        if pos < len(token) and token[pos] == '"':
            key, pos = _quoted(token, pos, "key")
        else:
            end = pos
            while end < len(token) and token[end] not in '.:"':
                end += 1
            key = token[pos:end]
            if not key:
                raise _fail(token, "a key is empty")
            if '"' in token[end : end + 1]:
                raise _fail(token, "quote a whole key, not part of one")
            pos = end
        path.append(key)
        if len(path) > MAX_DEPTH:
            raise _fail(token, f"a path has at most {MAX_DEPTH} keys")
        if pos >= len(token):
            raise _fail(token, "no ':' and value after the key")
        if token[pos] == ":":
            pos += 1
            break
        if token[pos] != ".":
            raise _fail(token, "a quoted key is followed by '.' or ':'")
        pos += 1
    raw = token[pos:]
    if not raw:
        raise _fail(token, "no value after ':' (an empty string is \"\")")
    if raw.startswith('"'):
        value, end = _quoted(token, pos, "value")
        if end != len(token):
            raise _fail(token, "text after the quoted value")
        return Term(column, tuple(path), json.dumps(value, ensure_ascii=False))
    if raw in _LITERALS:
        return Term(column, tuple(path), raw)
    if _NUMBER.fullmatch(raw):
        if not math.isfinite(float(raw)):
            raise _fail(token, "the number is out of range")
        return Term(column, tuple(path), raw)
    if raw[0] in "[{":
        raise _fail(token, "a value is one number, string, true, false or null")
    if '"' in raw:
        raise _fail(token, "quote a whole value, not part of one")
    return Term(column, tuple(path), json.dumps(raw, ensure_ascii=False))


def _check_size(text: str) -> None:
    if len(text) > MAX_CHARS:
        raise InvalidSearch(f"a search is at most {MAX_CHARS} characters", field="search")


def parse_terms(text: str) -> list[Term]:
    """Every token of ``text`` as a term (the API's ``search``)."""
    _check_size(text)
    found = []
    for token in tokens(text):
        if not is_term(token):
            raise _fail(token, "not a term")
        found.append(parse_term(token))
    if len(found) > MAX_TERMS:
        raise InvalidSearch(f"a search has at most {MAX_TERMS} terms", field="search")
    return found


def split_query(text: str) -> tuple[list[Term], str]:
    """The console's box: its terms, and the rest (an id, a dedupe key or a
    trace id) as typed, for the search it already did."""
    _check_size(text)
    parts = tokens(text)
    terms = [parse_term(t) for t in parts if is_term(t)]
    if not terms:
        return [], text.strip()
    if len(terms) > MAX_TERMS:
        raise InvalidSearch(f"a search has at most {MAX_TERMS} terms", field="search")
    return terms, " ".join(t for t in parts if not is_term(t))


def matching(terms: list[Term]) -> Q:
    """All the terms, as one filter."""
    q = Q()
    for term in terms:
        q &= term.q()
    return q


# --- Scopes: the terms among the tickets a caller may see ---------------------------------------

# The ticket's input and result under its submitter's and its endpoint's
# name (``ticket_search_scoped_idx``, SQL of its own in tickets' initial
# migration):
# ``{"s<submitter>": {"input": ..., "result": ...}, "e<endpoint>": {...}}``.
SCOPED = Func(
    F("submitted_by"),
    F("endpoint"),
    F("input"),
    F("result"),
    function="claimcheck_search_document",
    output_field=JSONField(),
)


def submitter_scope(user_id: int) -> str:
    return f"s{user_id}"


def endpoint_scope(endpoint_id: int) -> str:
    return f"e{endpoint_id}"


def within(terms: list[Term], scopes: list[str]) -> Q:
    """Every term, in one of ``scopes``: a ticket matches under its own
    submitter's scope or its own endpoint's, so this is exactly the
    tickets of those scopes that match (the index rechecks its hashes).
    At least one scope (no scope holds no ticket: ``newest_matching``)."""
    if not scopes:
        raise ValueError("within() needs a scope")
    q = Q()
    for scope in scopes:
        every = Q()
        for term in terms:
            every &= term.scoped_q(scope)
        q |= every
    return q


# --- The tickets in flight -----------------------------------------------------------------------


def in_flight(model, terms: list[Term]) -> list[QuerySet]:
    """The matches among the tickets not yet settled, whose rows the GIN
    indexes leave out (an admission and a turn's start write no entry
    there: tickets/models.py): queued ones by ``ticket_queued_idx``, the
    others by ``ticket_state_id_idx`` (each predicate named as the index
    names it, so the planner may use it), each row checked against the
    terms. They are the work in flight, few whatever the ledger's size; a
    caller's visibility is checked on the rows found."""
    return [
        model.objects.filter(matching(terms), state="queued").order_by().values("id"),
        model.objects.filter(matching(terms), ~Q(state__in=["succeeded", "queued"]))
        .exclude(state__in=SETTLED_STATES)
        .order_by()
        .values("id"),
    ]


# --- A page of matches, newest first ------------------------------------------------------------

# How many of the newest tickets in scope the first step reads (see
# ``newest_matching``): a term found in 1 % of them fills a page there.
WINDOW = 5000


def newest_matching(
    scope: QuerySet, terms: list[Term], n: int, scopes: list[str] | None = None
) -> list:
    """The ids of the ``n`` newest tickets of ``scope`` (the list's
    visibility and filters) that match every term, newest first.
    ``scopes`` (``within``) name the tickets ``scope`` can hold at most
    (the caller's own and their endpoints', or one endpoint's); None for
    every ticket (staff, no endpoint filter).

    Left to itself the planner cannot weigh a term: PostgreSQL estimates a
    containment from a sample of whole documents, so a value in 2 % of the
    tickets looks as rare as one in a million (or the reverse). Reading
    every match through the GIN index and sorting them costs what the match
    count costs (20,000 rows for 2 % of a million tickets); walking the id
    order until a page is found costs the distance to the page's last match
    (the whole ledger for a term that matches only old tickets, or none of
    the caller's). Two steps bound both:

    1. the newest ``WINDOW`` tickets of the scope, by the index the list
       already walks, each checked against the terms: a term in at least
       one of every ``WINDOW / n`` tickets fills the page here;
    2. otherwise the older matches: every match among ``scopes`` through
       the scoped GIN index (``ticket_search_scoped_idx``: the caller's
       matches only, whatever the others' tickets hold), or for staff every
       match through the input and result indexes, as an ``ARRAY``
       subquery (computed once: the planner cannot turn it into an id-order
       walk), the newest of them probed by primary key and checked against
       the scope's filters; beside them, the matches among the tickets in
       flight, which those indexes leave out (``in_flight``).

    Step 1 costs ``WINDOW`` rows, whatever the ledger's size; step 2 runs
    for a term in fewer than one of ``WINDOW / n`` recent tickets and costs
    the caller's matches (not the ledger's: a term in 20,000 tickets, none
    of them the caller's, is one index lookup that finds nothing). A term
    that matches few recent tickets but very many older ones costs that
    many rows.
    """
    hit = ExpressionWrapper(matching(terms), output_field=BooleanField())
    window = scope.order_by("-id").annotate(hit=hit).values_list("id", "hit")[:WINDOW]
    sql, params = window.query.sql_with_params()
    with connection.cursor() as cur:
        # The window's matches and its last row (where step 2 starts), in
        # id order as the index walks: it stops at the n-th match, so a
        # common term reads a few rows, not the window.
        cur.execute(
            "SELECT w.id, w.hit, w.rn FROM (SELECT x.id, x.hit, "
            f"row_number() OVER (ORDER BY x.id DESC) AS rn FROM ({sql}) x) w "  # noqa: S608 - Django's SQL
            "WHERE w.hit OR w.rn = %s ORDER BY w.id DESC LIMIT %s",
            [*params, WINDOW, n + 1],
        )
        rows = cur.fetchall()
    hits = [row[0] for row in rows if row[1]]
    floor = next((row[0] for row in rows if row[2] == WINDOW), None)
    if len(hits) >= n or floor is None or scopes == []:
        return hits[:n]
    settled = Q(state__in=SETTLED_STATES)
    if scopes is None:
        # Every match, unordered: the planner may combine the GIN indexes
        # with the scope's own filters, never walk the id order. Not the id
        # range either: with it beside the terms it might read that range
        # instead of the GIN index.
        inner = scope.filter(matching(terms), settled).order_by().values("id").query
    else:
        # The scopes' matches alone, from the scoped index: nothing else in
        # the statement for the planner to AND with it (a submitter's own
        # index holds half the ledger). Exact: a scope's document holds the
        # ticket's own input and result, and the index rechecks its hashes
        # on the row. The scope's filters are checked below, on the rows
        # found.
        model = scope.model
        inner = model.objects.filter(within(terms, scopes), settled).order_by().values("id").query
    parts = [inner, *(q.query for q in in_flight(scope.model, terms))]
    where, params = [], []
    for part in parts:
        part_sql, part_params = part.sql_with_params()
        where.append(f"tickets_ticket.id = ANY(ARRAY({part_sql}))")
        params += part_params
    older = scope.filter(id__lt=floor).extra(  # noqa: S610 - Django's SQL, parameters
        where=[" OR ".join(where)],
        params=params,
    )
    return hits + list(older.order_by("-id").values_list("id", flat=True)[: n - len(hits)])
