"""Headless recovery: the management commands call the same services."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from recovery.models import Inspection

pytestmark = pytest.mark.django_db


def run(*args) -> object:
    out = StringIO()
    call_command(*args, stdout=out)
    return json.loads(out.getvalue())


def test_operator_walks_a_case_from_the_command_line(quarantine, owner):
    q = quarantine(dedupe_key="cli")
    cases = run("recovery_cases", "--state", "open")
    assert [c["id"] for c in cases] == [str(q.case.id)]
    assert cases[0]["state"] == "open" and cases[0]["endpoint"] == q.endpoint.address

    inspection = run("recovery_inspect", str(q.case.id), "--user", "owner")
    assert inspection["actor"] == "owner" and inspection["snapshot"]["turn"]["seq"] == 1
    stored = Inspection.objects.get(id=inspection["id"])
    assert stored.sha256 == inspection["sha256"]

    decision = run(
        "recovery_decide",
        str(q.case.id),
        "--user",
        "owner",
        "--action",
        "authorize_rerun",
        "--inspection",
        inspection["id"],
        "--rationale",
        "safe to repeat",
    )
    assert decision["action"] == "authorize_rerun" and decision["rerun_ticket"]

    lesson = run(
        "recovery_lesson",
        str(q.case.id),
        "--user",
        "owner",
        "--what-failed",
        "runner ignored the interrupt",
        "--evidence",
        "no stop receipt",
        "--prevention",
        "cooperative stop",
    )
    assert lesson["what_failed"] == "runner ignored the interrupt"
    closed = run("recovery_cases", "--state", "closed")
    assert [c["id"] for c in closed] == [str(q.case.id)]
    assert closed[0]["lesson"]["id"] == lesson["id"]
    assert "snapshot" not in closed[0]["inspections"][0]  # listings stay small


def test_domain_errors_become_command_errors_with_their_detail(quarantine, owner, outsider):
    q = quarantine()
    with pytest.raises(CommandError, match="not_found: case .* not found"):
        call_command("recovery_inspect", str(q.case.id), "--user", "mallory")
    with pytest.raises(CommandError, match="no active user 'nobody'"):
        call_command("recovery_inspect", str(q.case.id), "--user", "nobody")
    with pytest.raises(CommandError, match="not_found"):
        call_command("recovery_inspect", "not-a-case", "--user", "owner")
    inspection = run("recovery_inspect", str(q.case.id), "--user", "owner")
    with pytest.raises(CommandError, match="invalid: .*evidence"):
        call_command(
            "recovery_decide",
            str(q.case.id),
            "--user",
            "owner",
            "--action",
            "release",
            "--inspection",
            inspection["id"],
            "--rationale",
            "r",
        )
    with pytest.raises(CommandError, match="invalid_transition: .*open"):
        call_command(
            "recovery_lesson",
            str(q.case.id),
            "--user",
            "owner",
            "--what-failed",
            "a",
            "--evidence",
            "b",
            "--prevention",
            "c",
        )
    assert q.refresh().case.state == "open"
