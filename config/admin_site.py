"""The admin site: Django's, open to staff and to endpoint owners who are
not staff. What an owner sees is each admin's ``owner_scope``
(core/readonly_admin.py); an admin without one, and every other app's
admin (users, groups), stays staff-only."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.http import HttpRequest

from endpoints.selectors import owned_endpoint_ids


def owns_an_endpoint(user) -> bool:
    """An active user who is not staff and owns at least one endpoint."""
    if not (user.is_authenticated and user.is_active) or user.is_staff:
        return False
    return bool(owned_endpoint_ids(user))


class OwnerAuthenticationForm(AdminAuthenticationForm):
    """The admin's log-in: staff, or an owner of an endpoint."""

    def confirm_login_allowed(self, user) -> None:
        AuthenticationForm.confirm_login_allowed(self, user)  # active
        if not (user.is_staff or owns_an_endpoint(user)):
            raise ValidationError(
                self.error_messages["invalid_login"],
                code="invalid_login",
                params={"username": self.username_field.verbose_name},
            )


class ClaimcheckAdminSite(admin.AdminSite):
    login_form = OwnerAuthenticationForm
    site_header = "Claimcheck admin (read-only)"
    site_title = "Claimcheck admin"

    def has_permission(self, request: HttpRequest) -> bool:
        user = request.user
        return user.is_active and (user.is_staff or owns_an_endpoint(user))
