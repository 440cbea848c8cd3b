"""Reads of endpoints shared by services, the API and the console."""

from __future__ import annotations

import uuid

from config.errors import NotFound

from .models import Endpoint, EndpointAlias


def resolve_endpoint(address: str) -> Endpoint:
    """The canonical endpoint for an address or one of its aliases."""
    if not isinstance(address, str) or not address:
        raise NotFound("endpoint address is empty")
    endpoint = Endpoint.objects.filter(address=address).first()
    if endpoint is None:
        alias = EndpointAlias.objects.select_related("endpoint").filter(alias=address).first()
        if alias is None:
            raise NotFound(f"endpoint {address!r} not found")
        endpoint = alias.endpoint
    return endpoint


def open_case_id(endpoint_id: int) -> uuid.UUID | None:
    from recovery.models import CaseState, RecoveryCase

    return (
        RecoveryCase.objects.filter(endpoint_id=endpoint_id, state=CaseState.OPEN)
        .values_list("id", flat=True)
        .first()
    )


def is_owner(user, endpoint: Endpoint) -> bool:
    """Owners are the members of the endpoint's owners group; staff act as owners."""
    if user is None or not user.is_authenticated:
        return False
    if user.is_staff:
        return True
    return endpoint.owners_id is not None and user.groups.filter(id=endpoint.owners_id).exists()
