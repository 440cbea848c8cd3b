from django.core.management.base import BaseCommand

from recovery import selectors
from recovery.models import RecoveryCase

from ._recovery import domain_errors, dump


class Command(BaseCommand):
    help = "List recovery cases as JSON, newest first (inspection snapshots left out)."

    def add_arguments(self, parser):
        parser.add_argument("--state", choices=["open", "decided", "closed"], default=None)
        parser.add_argument("--limit", type=int, default=100)

    def handle(self, *args, state, limit, **options):
        with domain_errors():
            # The operator's shell: every case (the API and console show each
            # user only the cases of the endpoints they own).
            cases = selectors.list_cases(cases=RecoveryCase.objects.all(), state=state, limit=limit)
        self.stdout.write(dump([selectors.case_payload(c, snapshots=False) for c in cases]))
