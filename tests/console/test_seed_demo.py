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
