from django.core.management.base import BaseCommand

from recovery import selectors, services
from recovery.models import DecisionAction

from ._recovery import domain_errors, dump, user_named


class Command(BaseCommand):
    help = "Record an owner's decision on an open recovery case; prints the decision as JSON."

    def add_arguments(self, parser):
        parser.add_argument("case_id")
        parser.add_argument("--user", required=True, help="the owner who decides")
        parser.add_argument("--action", required=True, choices=DecisionAction.values)
        parser.add_argument("--inspection", required=True, help="the inspection it rests on")
        parser.add_argument("--rationale", required=True)
        parser.add_argument("--evidence", default="", help="required for release")

    def handle(self, *args, case_id, user, action, inspection, rationale, evidence, **options):
        actor = user_named(user)
        with domain_errors():
            decision = services.decide(
                case_id=case_id,
                user=actor,
                action=action,
                inspection_id=inspection,
                rationale=rationale,
                evidence=evidence,
            )
        self.stdout.write(dump(selectors.decision_payload(decision)))
