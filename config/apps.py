from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ClaimcheckConfig(AppConfig):
    """Project-wide database plumbing: the grants made after every migrate
    (core/db_roles.py) and `migrate` honouring DATABASE_MIGRATE_URL."""

    name = "config"
    label = "claimcheck"
    verbose_name = "Claimcheck"

    def ready(self) -> None:
        from pathlib import Path

        from django.apps import apps

        from core import append_only
        from core.db_roles import grant_after_migrate
        from core.sqlfunctions import installer

        # core/sql/: the append-only triggers' functions (core/append_only.py),
        # installed with every app's sql/ folder after every migrate, first
        # (this app is registered before them): post_migrate is sent to
        # apps with a models module, this one's included (config/models.py).
        post_migrate.connect(
            installer(Path(append_only.FOLDER), tables=False),
            sender=self,
            weak=False,
            dispatch_uid="core-sql",
        )

        # post_migrate is sent once per app, in INSTALLED_APPS order; the
        # grants cover every table and function, so once per migrate is
        # enough: after the last app's, when every app's sql/ folder
        # (core/sqlfunctions.py) has installed its functions, the prune's
        # included.
        last = list(apps.get_app_configs())[-1]
        post_migrate.connect(grant_after_migrate, sender=last, dispatch_uid="claimcheck-grants")
