"""The admin's app config: Django's, with config/admin_site.py's site
(endpoint owners may look at what they own, read-only) as the default."""

from django.contrib.admin.apps import AdminConfig


class ClaimcheckAdminConfig(AdminConfig):
    default_site = "config.admin_site.ClaimcheckAdminSite"
