"""Per-user console preferences (today: the colour theme). Every write of a
``Preference`` row goes through here."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from core.errors import Invalid

from .models import Preference, Theme


def theme_of(user: AbstractBaseUser | None) -> str:
    """The user's theme; "system" for the anonymous and for a user who never chose."""
    if user is None or not user.is_authenticated:
        return Theme.SYSTEM
    chosen = Preference.objects.filter(user_id=user.pk).values_list("theme", flat=True).first()
    return chosen or Theme.SYSTEM


def set_theme(*, user: AbstractBaseUser, theme: str) -> str:
    """Remember ``theme`` for ``user``. One INSERT ... ON CONFLICT DO UPDATE:
    two tabs choosing at once leave one row, the later choice."""
    if theme not in Theme.values:
        raise Invalid(f"theme must be one of {', '.join(Theme.values)}", field="theme")
    Preference.objects.bulk_create(
        [Preference(user_id=user.pk, theme=theme, updated_at=timezone.now())],
        update_conflicts=True,
        unique_fields=["user"],
        update_fields=["theme", "updated_at"],
    )
    return theme
