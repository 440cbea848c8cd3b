"""Hardening: the production switches pass Django's deploy check, every page
carries the security headers and a CSP without inline script or style, login
is throttled by username and address together (in the database, so across
processes), and the API docs need no CDN."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from axes.models import AccessAttempt
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone

from console.owners import create_owner
from tests.conftest import ROOT, wait_for

PASSWORD = "pw-olive-1"

PRODUCTION = {
    "DEBUG": "0",
    "ALLOWED_HOSTS": "claimcheck.example",
    "SECURE_SSL_REDIRECT": "1",
    "SESSION_COOKIE_SECURE": "1",
    "CSRF_COOKIE_SECURE": "1",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
    "SECURE_HSTS_PRELOAD": "1",
    "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO=https",
    "CSRF_TRUSTED_ORIGINS": "https://claimcheck.example",
}


def deploy_check(extra: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in PRODUCTION}
    env.update(
        {
            "SECRET_KEY": secrets.token_urlsafe(50),
            "CLAIMCHECK_VAR_DIR": str(tmp_path),
            "PYTHONPATH": str(ROOT),
            **extra,
        }
    )
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- Production switches -------------------------------------------------------------------


def test_deploy_check_passes_with_the_production_switches_set(tmp_path):
    done = deploy_check(PRODUCTION, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def test_deploy_check_fails_without_them(tmp_path):
    done = deploy_check({"DEBUG": "0"}, tmp_path)
    assert done.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in done.stderr


def test_the_proxy_ssl_header_is_read_as_header_equals_value():
    from config.settings import _proxy_ssl_header

    assert _proxy_ssl_header("HTTP_X_FORWARDED_PROTO=https") == ("HTTP_X_FORWARDED_PROTO", "https")
    assert _proxy_ssl_header("") is None
    for bad in ("X_FORWARDED_PROTO=https", "HTTP_X_FORWARDED_PROTO", "HTTP_X="):
        with pytest.raises(ValueError):
            _proxy_ssl_header(bad)


# --- Security headers and the CSP ------------------------------------------------------------


def assert_secure_headers(response) -> None:
    csp = response["Content-Security-Policy"]
    directives = dict(
        (part.split(" ", 1) + [""])[:2] for part in (p.strip() for p in csp.split(";")) if part
    )
    assert directives["script-src"] == "'self'"
    assert directives["style-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert directives["object-src"] == "'none'"
    assert "unsafe" not in csp
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Frame-Options"] == "DENY"


@pytest.mark.django_db
def test_every_console_page_carries_the_security_headers(client, case, owner):
    assert_secure_headers(client.get("/login/"))
    client.force_login(owner)
    for url in ("/", "/tickets/", "/endpoints/", "/recovery/", f"/recovery/{case.id}/"):
        response = client.get(url)
        assert response.status_code == 200, url
        assert_secure_headers(response)
    assert_secure_headers(client.get("/api/v1/docs"))


INLINE = [
    (re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>", re.I), "script"),
    (re.compile(r"\son[a-z]+\s*=", re.I), "event handler"),
    (re.compile(r"\shx-on", re.I), "hx-on"),
    (re.compile(r"\sstyle\s*=", re.I), "style attribute"),
    (re.compile(r"<style", re.I), "style element"),
]


def test_templates_carry_no_inline_script_handler_or_style():
    found = []
    for path in sorted((ROOT / "templates").rglob("*.html")):
        text = path.read_text()
        for pattern, what in INLINE:
            for match in pattern.finditer(text):
                found.append(f"{path.relative_to(ROOT)}: {what}: {match.group(0)!r}")
    assert not found, "\n".join(found)


def test_the_trace_tree_indents_without_a_style_attribute():
    from console.templatetags.consoletags import indent

    assert indent(2) == '<span class="indent" aria-hidden="true"></span>' * 2
    assert indent(0) == "" and indent(None) == ""


# --- Login throttling --------------------------------------------------------------------------


def log_in(client, username: str, password: str, address: str = "10.0.0.1"):
    return client.post("/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


@pytest.fixture
def olive(db):
    return create_owner(username="olive", password=PASSWORD, endpoints=[])


def test_wrong_passwords_lock_out_a_username_at_one_address_only(client, olive, settings):
    settings.AXES_FAILURE_LIMIT = 5
    create_owner(username="sam", password=PASSWORD, endpoints=[])
    for _ in range(4):
        assert log_in(client, "olive", "wrong", "10.0.1.1").status_code == 200
    # The fifth failure in a row from this address is answered with the lockout ...
    assert log_in(client, "olive", "wrong", "10.0.1.1").status_code == 429
    # ... and so is the right password from there, until the window has passed.
    locked = log_in(client, "olive", PASSWORD, "10.0.1.1")
    assert locked.status_code == 429
    assert b"Too many failed log-ins" in locked.content
    assert b"Try again in 900 seconds" in locked.content
    assert "_auth_user_id" not in client.session, "a locked-out username logged in"
    # Whoever typed the wrong passwords did not lock olive out elsewhere ...
    ok = log_in(client, "olive", PASSWORD, "10.0.1.2")
    assert ok.status_code == 302 and ok["Location"] == "/"
    client.logout()
    # ... nor another user behind the same address.
    assert log_in(client, "sam", PASSWORD, "10.0.1.1").status_code == 302


def test_failures_spread_over_addresses_or_usernames_lock_nothing(client, olive, settings):
    settings.AXES_FAILURE_LIMIT = 5
    for i in range(6):
        assert log_in(client, "olive", "wrong", f"10.0.3.{i}").status_code == 200
        assert log_in(client, f"guess{i}", "wrong", "10.0.3.100").status_code == 200
    ok = log_in(client, "olive", PASSWORD, "10.0.3.100")
    assert ok.status_code == 302 and ok["Location"] == "/"


def test_the_documented_command_lifts_a_lockout(client, olive, settings):
    import io

    from django.core.management import call_command

    settings.AXES_FAILURE_LIMIT = 2
    for _ in range(2):
        log_in(client, "olive", "wrong", "10.0.5.1")
    assert log_in(client, "olive", PASSWORD, "10.0.5.1").status_code == 429
    call_command("axes_reset_ip_username", "10.0.5.1", "olive", stdout=io.StringIO())
    assert log_in(client, "olive", PASSWORD, "10.0.5.1").status_code == 302


def test_a_success_resets_the_username_count(client, olive, settings):
    settings.AXES_FAILURE_LIMIT = 3
    for _ in range(2):
        log_in(client, "olive", "wrong", "10.0.4.1")
    assert log_in(client, "olive", PASSWORD, "10.0.4.2").status_code == 302
    client.logout()
    for _ in range(2):
        log_in(client, "olive", "wrong", "10.0.4.3")
    assert log_in(client, "olive", PASSWORD, "10.0.4.4").status_code == 302


def test_the_lockout_ends_after_its_window(client, olive, settings):
    settings.AXES_FAILURE_LIMIT = 2
    settings.AXES_COOLOFF_TIME = timedelta(seconds=3)
    for _ in range(2):
        log_in(client, "olive", "wrong")
    assert log_in(client, "olive", PASSWORD).status_code == 429
    last = AccessAttempt.objects.get(username="olive").attempt_time
    # Wait on the clock, not with attempts: each attempt during the lockout
    # starts the window again.
    wait_for(lambda: timezone.now() > last + timedelta(seconds=3.05), timeout=10)
    assert log_in(client, "olive", PASSWORD).status_code == 302


def test_the_proxy_count_picks_the_address_the_proxy_saw(rf, settings):
    from console.throttle import client_ip

    request = rf.get("/", REMOTE_ADDR="10.9.9.9", HTTP_X_FORWARDED_FOR="6.6.6.6, 203.0.113.7")
    settings.LOGIN_PROXY_COUNT = 0
    assert client_ip(request) == "10.9.9.9"  # a client cannot choose its address
    settings.LOGIN_PROXY_COUNT = 1
    assert client_ip(request) == "203.0.113.7"  # not the spoofable left-most entry


@pytest.mark.django_db(transaction=True)
def test_a_lockout_holds_in_another_process(client, olive, settings):
    """The counts live in the database: a second process (another web
    worker) refuses the locked-out username at that address too."""
    limit = django_settings.AXES_FAILURE_LIMIT
    for _ in range(limit):
        log_in(client, "olive", "wrong")
    db = django_settings.DATABASES["default"]
    env = dict(
        os.environ,
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/"
        f"{connection.settings_dict['NAME']}",
        ALLOWED_HOSTS="testserver",
        PYTHONPATH=str(ROOT),
    )
    script = (
        "from django.test import Client; "
        f"r = Client().post('/login/', {{'username': 'olive', 'password': {PASSWORD!r}}}, "
        "REMOTE_ADDR='10.0.0.1'); print(r.status_code)"
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip().splitlines()[-1] == "429", done.stdout + done.stderr


# --- The demo owner stays off deployments ------------------------------------------------------


@pytest.mark.django_db
def test_seed_demo_refuses_with_debug_off_unless_asked_by_name(settings):
    import io

    from django.contrib.auth import get_user_model
    from django.core.management import CommandError, call_command

    settings.DEBUG = False
    with pytest.raises(CommandError, match="--allow-production"):
        call_command("seed_demo", stdout=io.StringIO(), stderr=io.StringIO())
    assert not get_user_model().objects.filter(username="demo").exists()
    call_command("seed_demo", allow_production=True, stdout=io.StringIO(), stderr=io.StringIO())
    assert get_user_model().objects.get(username="demo").is_active


# --- API docs without a CDN ---------------------------------------------------------------------


@pytest.mark.django_db
def test_swagger_ui_is_served_from_our_own_static_files(client):
    page = client.get("/api/v1/docs")
    assert page.status_code == 200
    html = page.content.decode()
    assert "cdn." not in html and "https://" not in html
    scripts = re.findall(r'<script src="([^"]+)"', html)
    styles = re.findall(r'<link[^>]+href="([^"]+\.css)"', html)
    assert scripts and styles
    for url in scripts + styles:
        assert url.startswith("/static/"), url
        response = client.get(url)
        assert response.status_code == 200, url
        response.close()  # a file response holds the file open until closed
