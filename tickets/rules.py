"""The ledger's rules that PL/pgSQL and Python both apply, each written once
as a SQL function in ``tickets/sql/`` and read from Python through these
expressions (in the query that reads the rows, so no round trip of its
own): "may start" and "who may see a ticket". The functions are IMMUTABLE
SQL: PostgreSQL inlines them, and a query using one plans as if the
expression were written out. "Root-like" and "owes a delivery" are the
database's alone (claimcheck_ticket_owes, in every move of a ticket)."""

from __future__ import annotations

from django.db.models import BooleanField, F, Func, Value


class _Named(Func):
    """A call of a rule's function in named notation (the house style for
    every ``claimcheck_*`` call: an argument added later cannot shift). A
    field's name is read as its column; ``casts`` types an argument given
    as a value."""

    output_field = BooleanField()
    names: tuple[str, ...] = ()
    casts: dict[str, str] = {}

    def __init__(self, *arguments) -> None:
        super().__init__(*(F(a) if isinstance(a, str) else a for a in arguments))

    def as_sql(self, compiler, connection, **extra):
        compiled = [compiler.compile(e) for e in self.get_source_expressions()]
        args = ", ".join(
            f"{name} => {sql}" + (f"::{self.casts[name]}" if name in self.casts else "")
            for name, (sql, _) in zip(self.names, compiled, strict=True)
        )
        return f"{self.function}({args})", tuple(p for _, params in compiled for p in params)


class Visible(_Named):
    """Who may see a ticket (``claimcheck_ticket_visible``, the rule's one
    home; admission's statement calls it too): for the user ``user_id``
    who owns the endpoints ``owned`` (None: every endpoint, staff).
    ``prefix`` reaches the ticket through a relation (``"ticket__"``)."""

    function = "claimcheck_ticket_visible"
    names = ("p_submitted_by", "p_endpoint", "p_user", "p_owned")
    casts = {"p_user": "integer", "p_owned": "bigint[]"}

    def __init__(self, user_id: int, owned: list[int] | None, prefix: str = "") -> None:
        super().__init__(
            f"{prefix}submitted_by_id",
            f"{prefix}endpoint_id",
            Value(user_id),
            Value(None if owned is None else list(owned)),
        )


class EndpointMayStart(_Named):
    """A turn may start on the endpoint: available and not paused
    (``claimcheck_endpoint_may_start``; the start, claimcheck_start_turn,
    calls it too). ``prefix`` reaches the endpoint through a relation
    (``"endpoint__"``)."""

    function = "claimcheck_endpoint_may_start"
    names = ("p_state", "p_paused_at")

    def __init__(self, prefix: str = "") -> None:
        super().__init__(f"{prefix}state", f"{prefix}paused_at")
