"""Write the state machines' edge checks and guards (core/edges.py) from
their Python source; ``--check`` only reports the files that differ."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from core.edges import files
from tickets import machines as ticket_machines

MACHINES = (
    (ticket_machines.TICKET, ticket_machines.SQL),
    (ticket_machines.TURN, ticket_machines.SQL),
)


def stale() -> dict:
    """Each generated file that is not what its machine gives: path → wanted text."""
    wanted = {}
    for machine, folder in MACHINES:
        for path, text in files(machine, folder).items():
            if not path.exists() or path.read_text() != text:
                wanted[path] = text
    return wanted


class Command(BaseCommand):
    help = "Generate the state machines' edge checks and guards (sql/claimcheck_*_edge_ok.sql)."

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="fail if a file is stale")

    def handle(self, *args, check: bool = False, **options):
        wanted = stale()
        if check and wanted:
            raise CommandError("stale: " + ", ".join(str(p) for p in wanted))
        for path, text in wanted.items():
            path.write_text(text)
            self.stdout.write(f"wrote {path}")
