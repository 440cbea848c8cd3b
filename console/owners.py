"""Accountable owners: console users in endpoints' owners groups."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from endpoints.selectors import resolve_endpoint


def create_owner(*, username: str, password: str, endpoints: list[str]):
    with transaction.atomic():
        user, _ = get_user_model().objects.get_or_create(username=username)
        user.set_password(password)
        user.save()
        for address in endpoints:
            endpoint = resolve_endpoint(address)
            if endpoint.owners_id is None:
                endpoint_group, _ = Group.objects.get_or_create(name=f"owners:{endpoint.address}")
                type(endpoint).objects.filter(id=endpoint.id).update(owners=endpoint_group)
                endpoint.owners = endpoint_group
            user.groups.add(endpoint.owners)
    return user
