"""Demo endpoints, a demo owner and an API key; safe to run again."""

import os

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management.base import BaseCommand, CommandError

from accounts.keys import create_api_key
from accounts.models import ApiKey
from console.owners import create_owner
from endpoints.models import Endpoint
from endpoints.services import add_owner, create_endpoint

DEMO = {
    "demo.echo": "runtime.demo.echo",
    "demo.sleep": "runtime.demo.sleep",
    "demo.stuck": "runtime.demo.stuck",
    "demo.stubborn": "runtime.demo.stubborn",
    "demo.fail": "runtime.demo.fail",
    "demo.research": "runtime.demo.research",
    "demo.approve": "runtime.demo.echo",
}
# Runner fields and budgets beyond the defaults. demo.stuck runs inline: an
# ignored interrupt cannot be proven stopped, so it shows quarantine (and a
# held worker slot). demo.stubborn runs in its own process: the escalation
# (SIGTERM, then SIGKILL) stops it and the exit status is the evidence.
# Short budgets, so the demo shows either within a minute.
RUNNER_EXTRA = {"demo.stuck": {"isolation": "inline"}}
SHORT = {"turn_budget_s": 20, "interrupt_grace_s": 5}
# demo.approve: its answers wait for an owner's approval before delivery
# (the console's "Approve", POST /tickets/{id}/approve).
BUDGETS = {
    "demo.stuck": SHORT,
    "demo.stubborn": SHORT,
    "demo.sleep": SHORT,
    "demo.approve": {"requires_approval": True},
}
OWNER, PASSWORD = "demo", "demo-owner"
# The apps whose records the admin shows (view-only: core/readonly_admin.py).
LEDGER_APPS = ("tickets", "endpoints", "runtime", "recovery")
# Agent endpoints (runner kind "agent"): created when their framework is
# installed (the optional dependency group, e.g. `uv sync --extra pydantic-ai`).
# The seed's weekly research brief as a schedule (docs/howto/schedules.md): Monday
# 09:00 UTC, the newest missed week caught up after a downtime.
WEEKLY_BRIEF = {
    "endpoint": "demo.research",
    "cron": "0 9 * * 1",
    "timezone": "UTC",
    "input": {"topic": "weekly research brief", "children": 2},
    "catch_up": "latest",
}
AGENT_DEMO = {
    "demo.agent": {"kind": "agent", "framework": "pydantic_ai", "path": "runtime.demo.agent"},
}
# The research agents of examples/ (examples/README.md), one trio per
# framework: created when the framework is installed and the workers'
# allow-list (RUNNER_PYTHON_ALLOWED_PREFIXES) takes "examples." (`make run`
# sets both), so their turns run on the running workers.
EXAMPLES = {
    framework: {
        f"examples.{prefix}-{role}": {
            "kind": "agent",
            "framework": framework,
            "path": f"examples.{module}.{factory}",
        }
        for role, factory in (
            ("research", "researcher"),
            ("search", "searcher"),
            ("summarize", "summarizer"),
        )
    }
    for framework, prefix, module in (
        ("pydantic_ai", "pai", "research_pydantic_ai"),
        ("openai_agents", "oai", "research_openai_agents"),
        ("langgraph", "lg", "research_langgraph"),
    )
}


class Command(BaseCommand):
    help = "Create the demo endpoints, owner 'demo' and an API key (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--allow-production",
            action="store_true",
            help="seed even with DEBUG off (the demo owner's password is public: "
            "never on a reachable deployment)",
        )

    def handle(self, *args, **options):
        # The demo owner is staff with a password printed in the README and the tutorial: on a
        # deployment (DEBUG off) it would be a known log-in to the console
        # and /admin/. Refused there unless asked for by name.
        if not settings.DEBUG and not options["allow_production"]:
            raise CommandError(
                "seed_demo creates staff user 'demo' with a published password; "
                "DEBUG is off, so this looks like a deployment. Pass --allow-production "
                "to seed anyway (a local `make run` does)."
            )
        for address, path in DEMO.items():
            if not Endpoint.objects.filter(address=address).exists():
                create_endpoint(
                    address=address,
                    runner={"kind": "python", "path": path, **RUNNER_EXTRA.get(address, {})},
                    actor="command:seed_demo",
                    **BUDGETS.get(address, {}),
                )
                self.stderr.write(f"created endpoint {address}")
        for address, runner in AGENT_DEMO.items():
            if not Endpoint.objects.filter(address=address).exists() and _installed(runner):
                create_endpoint(address=address, runner=runner, actor="command:seed_demo")
                self.stderr.write(f"created endpoint {address}")
        examples = self._seed_examples()
        owned = [
            *DEMO,
            *(a for a in AGENT_DEMO if Endpoint.objects.filter(address=a).exists()),
            *examples,
        ]
        # An existing demo owner keeps its password, and so its sessions (a
        # new password hash logs every console session out): only ownership
        # of the demo endpoints is made sure of.
        owner = get_user_model().objects.filter(username=OWNER).first()
        if owner is None:
            create_owner(username=OWNER, password=PASSWORD, endpoints=owned)
        else:
            for address in owned:
                add_owner(address=address, user=owner, actor="command:seed_demo")
        _weekly_brief(self.stderr)
        key_file = settings.VAR_DIR / "demo_api_key"
        key = key_file.read_text().strip() if key_file.exists() else ""
        prefix = key.split("_")[1] if key.count("_") >= 2 else ""
        if not key or not ApiKey.objects.filter(prefix=prefix, revoked_at__isnull=True).exists():
            _, key = create_api_key(username=OWNER, name="demo", staff=True)
            key_file.touch(mode=0o600)
            key_file.write_text(key)
        # The demo key is a staff key, which makes the demo owner staff (it
        # sees every ticket in the console already): the admin shows staff
        # what their view permissions name, so it gets the ledger's.
        get_user_model().objects.get(username=OWNER).user_permissions.add(
            *Permission.objects.filter(
                content_type__app_label__in=LEDGER_APPS, codename__startswith="view_"
            )
        )
        port = os.environ.get("PORT") or "8000"
        self.stdout.write(
            f"console: http://127.0.0.1:{port}/login/  user {OWNER}  password {PASSWORD}"
        )
        self.stdout.write(f"API key: {key}")

    def _seed_examples(self) -> list[str]:
        """The examples' endpoints that exist (made now if missing and
        possible); a line for each framework that is left out, and why."""
        prefixes = [p for p in settings.RUNNER_PYTHON_ALLOWED_PREFIXES if p]
        present = []
        for framework, endpoints in EXAMPLES.items():
            first = next(iter(endpoints.values()))
            if not _installed(first):
                self.stderr.write(f"examples for {framework}: not installed, not seeded")
                continue
            if not all(any(r["path"].startswith(p) for p in prefixes) for r in endpoints.values()):
                self.stderr.write(
                    f"examples for {framework}: RUNNER_PYTHON_ALLOWED_PREFIXES does not take "
                    "'examples.', not seeded"
                )
                continue
            for address, runner in endpoints.items():
                if not Endpoint.objects.filter(address=address).exists():
                    create_endpoint(address=address, runner=runner, actor="command:seed_demo")
                    self.stderr.write(f"created endpoint {address}")
                present.append(address)
        return present


def _installed(runner: dict) -> bool:
    from runtime.agents.runner import load_adapter
    from runtime.runners import RunnerError

    try:
        load_adapter(runner["framework"])
    except RunnerError:
        return False
    return True


def _weekly_brief(stderr) -> None:
    """The demo owner's weekly brief schedule, once (found by its endpoint and cron)."""
    from tickets import schedules
    from tickets.models import Schedule

    brief = WEEKLY_BRIEF
    if Schedule.objects.filter(endpoint__address=brief["endpoint"], cron=brief["cron"]).exists():
        return
    owner = get_user_model().objects.get(username=OWNER)
    schedule = schedules.create_schedule(user=owner, **brief)
    stderr.write(f"created schedule {schedule.id} ({brief['cron']} on {brief['endpoint']})")
