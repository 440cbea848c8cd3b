"""API keys: stored hashed; the plain key is shown once, at creation."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiKey(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100, blank=True, default="")
    # The first characters of the key, to find the row without scanning.
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Fair-share limits of this key's own, set by staff (create_api_key
    # --rate / --concurrent-requests): a key with either is counted on its
    # own rather than in its user's shared budget (core/fairshare.py). None:
    # the setting (RATE_LIMIT_ADMISSIONS, RATE_LIMIT_CONCURRENT_REQUESTS);
    # "" and 0: no limit.
    rate_limit_admissions = models.CharField(max_length=200, null=True, blank=True)
    rate_limit_concurrent_requests = models.PositiveIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.user} {self.prefix}…"

    @property
    def has_own_limits(self) -> bool:
        return (
            self.rate_limit_admissions is not None
            or self.rate_limit_concurrent_requests is not None
        )
