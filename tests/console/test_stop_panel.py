"""The case page's "Worker process" panel alone (what the page polls while a
stop waits for its worker): the case's viewers get it, saying the stop is
pending rather than that the process still runs; anyone else gets 404."""

from __future__ import annotations

import pytest

from console.owners import create_owner
from recovery import services as recovery
from runtime import registry

from .helpers import quarantined_case

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_panel_polls_while_a_stop_is_pending_and_is_404_to_a_stranger(
    client, settings, django_user_model
):
    settings.WORKER_LOST_AFTER_S = 600
    case = quarantined_case("web.stuck")
    olive = create_owner(username="olive", password="pw-olive-1", endpoints=["web.stuck"])
    registry.register_worker(
        name="turns@hostA", host="hostA", pid=4242, queues=["turns"], pool_size=1
    )
    registry.set_node("turns@hostA")
    try:
        registry.slot_busy(case.turn_id)
    finally:
        registry.set_node("")
    inspection = recovery.inspect_case(case_id=case.id, user=olive)
    recovery.decide(
        case_id=case.id,
        user=olive,
        action="finalize_orphan",
        inspection_id=inspection.id,
        rationale="not wanted",
    )
    url = f"/recovery/{case.id}/stop-process/panel/"
    client.force_login(olive)
    before = client.get(url).content.decode()
    assert "still runs in process" in before and "data-stop-pending" not in before
    recovery.stop_process(case_id=case.id, user=olive, rationale="free the slot")
    pending = client.get(url).content.decode()
    assert "data-stop-pending" in pending and 'hx-trigger="every 1s"' in pending
    assert "waiting for worker turns@hostA" in pending and "still runs" not in pending
    stranger = django_user_model.objects.create_user("sid", password="pw-sid-1")
    client.force_login(stranger)
    assert client.get(url).status_code == 404
