from __future__ import annotations

import pytest

from console.owners import create_owner

from .helpers import echo_endpoint, quarantined_case


@pytest.fixture
def case(db):
    return quarantined_case("con.stuck")


@pytest.fixture
def owner(case):
    return create_owner(username="olive", password="pw-olive-1", endpoints=[case.endpoint.address])


@pytest.fixture
def member(db, django_user_model):
    """Logged in, but an owner of nothing."""
    return django_user_model.objects.create_user("mallory", password="pw-mallory-1")


@pytest.fixture
def viewer(db, django_user_model):
    """Logged in as staff: sees every ticket and case, for the tests that
    look at how pages draw them (tests/test_authorization.py checks who
    sees what)."""
    return django_user_model.objects.create_user("vera", password="pw-vera-1", is_staff=True)


@pytest.fixture
def echo(db):
    return echo_endpoint("con.echo")
