"""Accountable owners: console users in endpoints' owners groups."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction

from endpoints.services import add_owner


def create_owner(*, username: str, password: str, endpoints: list[str]):
    with transaction.atomic():
        user, _ = get_user_model().objects.get_or_create(username=username)
        user.set_password(password)
        user.save()
        for address in endpoints:
            # Through the endpoint service: a change of owners is an
            # EndpointEvent like any other configuration change.
            add_owner(address=address, user=user, actor=f"command:create_owner {username}")
    return user
