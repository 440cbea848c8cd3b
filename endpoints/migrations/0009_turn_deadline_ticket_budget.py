"""A turn's deadline honours its ticket's own budget (``tickets.Ticket.budget_s``,
set by a retry or a re-run with a smaller budget): the smaller of the
ticket's and the endpoint's ``turn_budget_s``. The start function of
migration 0007 is replaced with two fragments changed, the rest as it was;
a later change of ``claimcheck_start_turn`` must keep them."""

import importlib

from django.db import migrations

_START = importlib.import_module("endpoints.migrations.0007_turn_functions").START_TURN

_CHANGES = [
    (
        "tk AS (\n    SELECT t.id FROM tickets_ticket t\n",
        "tk AS (\n    SELECT t.id, t.budget_s FROM tickets_ticket t\n",
    ),
    (
        "ep.now + make_interval(secs => ep.turn_budget_s)",
        "ep.now + make_interval(secs => LEAST(ep.turn_budget_s,"
        " COALESCE(tk.budget_s, ep.turn_budget_s)))",
    ),
]


def _changed(sql: str) -> str:
    for old, new in _CHANGES:
        if sql.count(old) != 1:
            raise RuntimeError(f"claimcheck_start_turn changed: {old!r} is not in it once")
        sql = sql.replace(old, new)
    return sql


class Migration(migrations.Migration):
    dependencies = [
        ("endpoints", "0008_runner_kind_agent"),
        ("tickets", "0018_ticket_retry_of_budget"),
    ]

    operations = [migrations.RunSQL(_changed(_START), reverse_sql=_START)]
