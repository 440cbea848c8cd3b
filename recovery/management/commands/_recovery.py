"""Shared by the recovery commands: find the acting user, print JSON, turn
domain errors into ``CommandError`` with their detail."""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from core.errors import DomainError


def user_named(username: str):
    user = get_user_model().objects.filter(username=username).first()
    if user is None or not user.is_active:
        raise CommandError(f"no active user {username!r}")
    return user


def dump(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@contextmanager
def domain_errors():
    try:
        yield
    except DomainError as exc:
        raise CommandError(f"{exc.code}: {exc.detail}") from exc
