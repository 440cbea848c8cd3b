"""The ledger's rules that PL/pgSQL and Python both apply, each written once
as a SQL function in ``tickets/sql/`` and read from Python through these
expressions (in the query that reads the rows, so no round trip of its
own). The functions are IMMUTABLE SQL: PostgreSQL inlines them, and a query
using one plans as if the expression were written out."""

from __future__ import annotations

from django.db.models import BooleanField, F, Func


class _Named(Func):
    """A call of a rule's function in named notation (the house style for
    every ``claimcheck_*`` call: an argument added later cannot shift)."""

    output_field = BooleanField()
    names: tuple[str, ...] = ()

    def __init__(self, *fields: str) -> None:
        super().__init__(*(F(name) for name in fields))

    def as_sql(self, compiler, connection, **extra):
        compiled = [compiler.compile(e) for e in self.get_source_expressions()]
        args = ", ".join(
            f"{name} => {sql}" for name, (sql, _) in zip(self.names, compiled, strict=True)
        )
        return f"{self.function}({args})", tuple(p for _, params in compiled for p in params)


class RootLike(_Named):
    """A ticket that answers a requester: a root, or a re-run that carries
    its original's obligation (``claimcheck_ticket_root_like``; the finish
    of a turn calls it too)."""

    function = "claimcheck_ticket_root_like"
    names = ("p_parent", "p_rerun_of", "p_obligation_state")

    def __init__(self, prefix: str = "") -> None:
        super().__init__(f"{prefix}parent_id", f"{prefix}rerun_of_id", f"{prefix}obligation_state")


class EndpointMayStart(_Named):
    """A turn may start on the endpoint: available and not paused
    (``claimcheck_endpoint_may_start``; the start, claimcheck_start_turn,
    calls it too). ``prefix`` reaches the endpoint through a relation
    (``"endpoint__"``)."""

    function = "claimcheck_endpoint_may_start"
    names = ("p_state", "p_paused_at")

    def __init__(self, prefix: str = "") -> None:
        super().__init__(f"{prefix}state", f"{prefix}paused_at")
