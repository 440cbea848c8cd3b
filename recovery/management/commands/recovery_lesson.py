from django.core.management.base import BaseCommand

from recovery import selectors, services

from ._recovery import domain_errors, dump, user_named


class Command(BaseCommand):
    help = "Write the lesson of a decided recovery case, which closes it; prints it as JSON."

    def add_arguments(self, parser):
        parser.add_argument("case_id")
        parser.add_argument("--user", required=True, help="the owner who writes it")
        parser.add_argument("--what-failed", required=True, dest="what_failed")
        parser.add_argument("--evidence", required=True)
        parser.add_argument("--prevention", required=True)

    def handle(self, *args, case_id, user, what_failed, evidence, prevention, **options):
        actor = user_named(user)
        with domain_errors():
            lesson = services.write_lesson(
                case_id=case_id,
                user=actor,
                what_failed=what_failed,
                evidence=evidence,
                prevention=prevention,
            )
        self.stdout.write(dump(selectors.lesson_payload(lesson)))
