"""The database itself refuses UPDATE and DELETE on inspections, decisions,
lessons and case evidence (triggers from recovery/migrations/0001_initial.py, which
refuse even the tables' owner; the application role is refused first by its
privileges), whatever code path asks."""

from __future__ import annotations

import psycopg
import pytest
from django.db import DatabaseError, transaction

from recovery import services
from recovery.models import CaseEvidence, Decision, Inspection, Lesson
from runtime import turns as runtime
from runtime.runners import Outcome

# The owner's statements run on their own connection: the data must be committed.
pytestmark = pytest.mark.django_db(transaction=True)

STATEMENTS = {
    "recovery_inspection": [
        "UPDATE {t} SET sha256 = 'forged' WHERE id = %s",
        "UPDATE {t} SET snapshot = '{{}}'::jsonb WHERE id = %s",
        "DELETE FROM {t} WHERE id = %s",
    ],
    "recovery_decision": [
        "UPDATE {t} SET rationale = 'rewritten' WHERE id = %s",
        "UPDATE {t} SET action = 'release' WHERE id = %s",
        "DELETE FROM {t} WHERE id = %s",
    ],
    "recovery_lesson": [
        "UPDATE {t} SET prevention = 'nothing' WHERE id = %s",
        "DELETE FROM {t} WHERE id = %s",
    ],
    "recovery_caseevidence": [
        "UPDATE {t} SET kind = 'forged' WHERE id = %s",
        "DELETE FROM {t} WHERE id = %s",
    ],
}


@pytest.fixture
def closed_case(quarantine, owner):
    q = quarantine()
    runtime.finish_turn(
        turn_id=q.turn.id, seq=q.turn.seq, outcome=Outcome.success({"late": 1}), source="worker"
    )
    inspection = services.inspect_case(case_id=q.case.id, user=owner)
    decision = services.decide(
        case_id=q.case.id,
        user=owner,
        action="finalize_orphan",
        inspection_id=inspection.id,
        rationale="r",
    )
    lesson = services.write_lesson(
        case_id=q.case.id, user=owner, what_failed="a", evidence="b", prevention="c"
    )
    return {
        "recovery_inspection": (Inspection, inspection.id),
        "recovery_decision": (Decision, decision.id),
        "recovery_lesson": (Lesson, lesson.id),
        "recovery_caseevidence": (CaseEvidence, CaseEvidence.objects.get(case=q.case).id),
    }


@pytest.mark.parametrize(
    ("table", "sql"), [(t, s) for t, stmts in STATEMENTS.items() for s in stmts]
)
def test_the_database_refuses_changes_to_recovery_records(closed_case, table, sql, owner_cursor):
    model, pk = closed_case[table]
    before = model.objects.filter(pk=pk).values().get()
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        owner_cursor.execute(sql.format(t=table), [pk])
    assert model.objects.filter(pk=pk).values().get() == before


def test_the_orm_cannot_rewrite_or_delete_them_either(closed_case):
    # The application role's privileges refuse first; with one role, the trigger.
    refused = "append-only|permission denied"
    inspection, pk = closed_case["recovery_inspection"]
    with pytest.raises(DatabaseError, match=refused), transaction.atomic():
        inspection.objects.filter(pk=pk).update(sha256="0" * 64)
    # The lesson is referenced by nothing, so only the trigger and the
    # privileges stand in the way.
    lesson, lesson_pk = closed_case["recovery_lesson"]
    with pytest.raises(DatabaseError, match=refused), transaction.atomic():
        lesson.objects.get(pk=lesson_pk).delete()
    assert lesson.objects.filter(pk=lesson_pk).exists()
    assert inspection.objects.get(pk=pk).sha256 != "0" * 64
