"""What every console template may use without its view passing it."""

from __future__ import annotations

from django.utils.functional import SimpleLazyObject

from . import preferences
from .models import Theme


def theme(request):
    """The user's colour theme for base.html's ``<html data-theme>``. Lazy:
    a region that htmx swaps in never reads it, and costs no query."""
    return {
        "theme": SimpleLazyObject(lambda: preferences.theme_of(getattr(request, "user", None))),
        "themes": Theme.choices,
    }
