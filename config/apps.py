from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ClaimcheckConfig(AppConfig):
    """Project-wide database plumbing: the grants made after every migrate
    (core/db_roles.py) and `migrate` honouring DATABASE_MIGRATE_URL."""

    name = "config"
    label = "claimcheck"
    verbose_name = "Claimcheck"

    def ready(self) -> None:
        from core.db_roles import grant_after_migrate

        # sender=self: post_migrate is sent once per app; the grants cover
        # every table, so once per migrate is enough.
        post_migrate.connect(grant_after_migrate, sender=self, dispatch_uid="claimcheck-grants")
