"""What the console remembers per user. (API keys are accounts.ApiKey.)"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Theme(models.TextChoices):
    """The console's colour scheme: "system" follows the operating system."""

    SYSTEM = "system", "System"
    LIGHT = "light", "Light"
    DARK = "dark", "Dark"


class Preference(models.Model):
    """What the console remembers for one user, whatever browser they use.
    No row: every default (the theme follows the system)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="console_preference",
    )
    theme = models.CharField(max_length=8, choices=Theme.choices, default=Theme.SYSTEM)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(theme__in=Theme.values), name="console_preference_theme_known"
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} theme={self.theme}"
