from django.core.management.base import BaseCommand

from recovery import selectors, services

from ._recovery import domain_errors, dump, user_named


class Command(BaseCommand):
    help = "Inspect a recovery case as USERNAME (an owner): prints the stored snapshot as JSON."

    def add_arguments(self, parser):
        parser.add_argument("case_id")
        parser.add_argument("--user", required=True, help="the owner who inspects")

    def handle(self, *args, case_id, user, **options):
        actor = user_named(user)
        with domain_errors():
            inspection = services.inspect_case(case_id=case_id, user=actor)
        self.stdout.write(dump(selectors.inspection_payload(inspection)))
