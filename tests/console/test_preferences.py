"""The colour theme a console user chooses: remembered per user on the
server (console/preferences.py), rendered in ``<html data-theme>``."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from console import preferences
from console.models import Preference
from core.errors import Invalid

pytestmark = pytest.mark.django_db

JSON = {"HTTP_ACCEPT": "application/json"}


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password="pw-alice-1")


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob", password="pw-bob-1")


def html_theme(response) -> str:
    body = response.content.decode()
    return body.split('<html lang="en" data-theme="', 1)[1].split('"', 1)[0]


def test_a_user_who_never_chose_follows_the_system(alice):
    assert preferences.theme_of(alice) == "system"


def test_setting_twice_keeps_one_row_with_the_later_choice(alice):
    preferences.set_theme(user=alice, theme="dark")
    preferences.set_theme(user=alice, theme="light")
    assert list(Preference.objects.values_list("user_id", "theme")) == [(alice.pk, "light")]
    assert preferences.theme_of(alice) == "light"


def test_an_unknown_theme_is_refused_and_nothing_is_written(alice):
    with pytest.raises(Invalid, match="theme must be one of system, light, dark"):
        preferences.set_theme(user=alice, theme="sepia")
    assert not Preference.objects.exists()


def test_the_database_refuses_an_unknown_theme(alice):
    refused = pytest.raises(IntegrityError, match="console_preference_theme_known")
    with refused, transaction.atomic():
        Preference.objects.create(user=alice, theme="sepia", updated_at="2026-12-02T00:00:00Z")


def test_pages_render_the_users_theme_and_the_pressed_button(client, alice, bob):
    preferences.set_theme(user=alice, theme="dark")
    client.force_login(alice)
    page = client.get("/tickets/")
    assert html_theme(page) == "dark"
    body = page.content.decode()
    assert '<meta name="color-scheme" content="dark">' in body
    assert 'value="dark" aria-pressed="true"' in body
    assert 'value="light" aria-pressed="false"' in body
    # Another user's choice is their own.
    client.force_login(bob)
    page = client.get("/tickets/")
    assert html_theme(page) == "system"
    assert '<meta name="color-scheme" content="light dark">' in page.content.decode()


def test_the_login_page_follows_the_system(client):
    assert html_theme(client.get("/login/")) == "system"


def test_a_form_post_remembers_the_choice_and_goes_back(client, alice):
    client.force_login(alice)
    back = "/tickets/?state=queued"
    response = client.post("/preferences/theme/", {"theme": "light", "next": back})
    assert response.status_code == 302
    assert response["Location"] == back
    assert preferences.theme_of(alice) == "light"
    assert html_theme(client.get("/tickets/")) == "light"


@pytest.mark.parametrize(
    "back", ["https://evil.example/", "//evil.example/", "javascript:alert(1)", "", "tickets/"]
)
def test_a_form_post_never_goes_back_off_site(client, alice, back):
    client.force_login(alice)
    response = client.post("/preferences/theme/", {"theme": "dark", "next": back})
    assert response.status_code == 302
    assert response["Location"] == "/"


def test_script_gets_json(client, alice):
    client.force_login(alice)
    response = client.post("/preferences/theme/", {"theme": "dark"}, **JSON)
    assert response.status_code == 200
    assert response.json() == {"theme": "dark"}
    assert preferences.theme_of(alice) == "dark"


def test_an_unknown_theme_is_a_400_with_the_documented_code(client, alice):
    client.force_login(alice)
    response = client.post("/preferences/theme/", {"theme": "sepia"}, **JSON)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid"
    assert response.json()["field"] == "theme"
    # Without script: back to the page, the refusal as a notice.
    response = client.post("/preferences/theme/", {"next": "/tickets/"}, follow=True)
    assert response.redirect_chain == [("/tickets/", 302)]
    assert "theme must be one of" in response.content.decode()
    assert not Preference.objects.exists()


def test_anonymous_callers_change_nothing(client):
    response = client.post("/preferences/theme/", {"theme": "dark"}, **JSON)
    assert response.status_code == 401
    assert response.json()["error"] == "unauthenticated"
    response = client.post("/preferences/theme/", {"theme": "dark"})
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")
    assert not Preference.objects.exists()


def test_only_post_with_the_csrf_token(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.get("/preferences/theme/").status_code == 405
    assert client.post("/preferences/theme/", {"theme": "dark"}).status_code == 403
    assert not Preference.objects.exists()
    page = client.get("/")
    token = page.content.decode().split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
    response = client.post("/preferences/theme/", {"theme": "dark", "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert preferences.theme_of(alice) == "dark"


def test_a_region_refresh_reads_no_preference(client, alice):
    """The theme is read lazily, by the whole page only: an htmx region (a
    live refresh) renders without that query."""
    preferences.set_theme(user=alice, theme="dark")
    client.force_login(alice)
    client.get("/obligations/")  # warm: session, user
    with CaptureQueriesContext(connection) as whole:
        client.get("/obligations/")
    with CaptureQueriesContext(connection) as region:
        client.get("/obligations/", HTTP_HX_REQUEST="true")
    assert any("console_preference" in q["sql"] for q in whole.captured_queries)
    assert not any("console_preference" in q["sql"] for q in region.captured_queries)
