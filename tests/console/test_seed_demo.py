"""`seed_demo` runs at every `make run`: an existing demo owner keeps its
password, and with it its console sessions."""

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_seeding_again_keeps_the_demo_password_and_its_sessions(client, settings, tmp_path):
    settings.VAR_DIR = tmp_path  # the demo API key file
    seed = {"allow_production": True, "stdout": io.StringIO(), "stderr": io.StringIO()}
    call_command("seed_demo", **seed)
    demo = get_user_model().objects.get(username="demo")
    demo.set_password("chosen-by-the-owner")
    demo.save()
    client.force_login(demo)
    assert client.get("/").status_code == 200

    call_command("seed_demo", **seed)

    demo.refresh_from_db()
    assert demo.check_password("chosen-by-the-owner")
    assert client.get("/").status_code == 200  # the session was not logged out
    assert demo.groups.filter(name="owners:demo.echo").exists()


def test_the_demo_owner_can_look_in_the_admin(client, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    call_command("seed_demo", allow_production=True, stdout=io.StringIO(), stderr=io.StringIO())
    login = client.post("/admin/login/", {"username": "demo", "password": "demo-owner"})
    assert login.status_code == 302
    index = client.get("/admin/").content.decode()
    assert "have permission to view or edit anything" not in index
    for label in (">Tickets<", ">Deliveries<", ">Recovery cases<", ">Endpoints<"):
        assert label in index, label
    assert client.get("/admin/tickets/ticket/").status_code == 200
    assert client.get("/admin/auth/user/").status_code == 403  # the ledger's records only


def test_seeding_makes_an_approval_endpoint_and_the_examples_the_workers_allow(settings, tmp_path):
    """demo.approve holds its answers for approval; the examples' agents
    are seeded, owned by demo, only where the allow-list takes them (as
    `make run` sets it), and a line says why when they are not."""
    from endpoints.models import Endpoint

    settings.VAR_DIR = tmp_path
    settings.RUNNER_PYTHON_ALLOWED_PREFIXES = ["runtime.demo."]
    err = io.StringIO()
    call_command("seed_demo", allow_production=True, stdout=io.StringIO(), stderr=err)
    assert Endpoint.objects.get(address="demo.approve").requires_approval is True
    assert not Endpoint.objects.filter(address__startswith="examples.").exists()
    assert "examples for pydantic_ai: RUNNER_PYTHON_ALLOWED_PREFIXES" in err.getvalue()

    settings.RUNNER_PYTHON_ALLOWED_PREFIXES = ["runtime.demo.", "examples."]
    call_command("seed_demo", allow_production=True, stdout=io.StringIO(), stderr=io.StringIO())
    seeded = set(
        Endpoint.objects.filter(address__startswith="examples.").values_list("address", flat=True)
    )
    assert seeded == {
        f"examples.{p}-{role}"
        for p in ("pai", "oai", "lg")
        for role in ("research", "search", "summarize")
    }
    demo = get_user_model().objects.get(username="demo")
    assert demo.groups.filter(name="owners:examples.oai-research").exists()
