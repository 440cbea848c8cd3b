"""No migration imports an app's own code (its models, services, SQL held in
Python strings): a migration is history, and one that imported today's code
would write today's text into a fresh database while an upgraded one kept
what ran then. SQL that must follow the code lives in an app's ``sql/``
folder (core/sqlfunctions.py). Imports of ``django`` and of ``core`` (the
ids' default, below every app) are the only ones allowed."""

from __future__ import annotations

import ast
from pathlib import Path

from django.apps import apps

ROOT = Path(__file__).resolve().parents[2]


def _project_apps() -> set[str]:
    # The repository's own packages: a virtualenv inside the checkout
    # (.venv/, as `make install` makes it) holds Django's, which are not.
    found = set()
    for config in apps.get_app_configs():
        path = Path(config.path).resolve()
        if path.is_relative_to(ROOT) and not path.relative_to(ROOT).parts[0].startswith("."):
            found.add(config.name.split(".")[0])
    return found


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def offending(root: Path, app_names: set[str]) -> list[str]:
    found = []
    for path in sorted(root.glob("*/migrations/*.py")):
        for name in _imports(path):
            top, _, rest = name.partition(".")
            if top in app_names and not rest.startswith("migrations"):
                found.append(f"{path.relative_to(root)} imports {name}")
    return found


def test_no_migration_imports_an_apps_code():
    names = _project_apps()
    assert {"tickets", "runtime", "endpoints", "recovery"} <= names
    assert offending(ROOT, names) == []


def test_the_check_sees_such_an_import(tmp_path):
    planted = Path("tickets", "migrations", "0099_planted.py")  # in tmp_path only
    (tmp_path / planted).parent.mkdir(parents=True)
    (tmp_path / planted).write_text(
        "from django.db import migrations\nfrom tickets.retention import prune\n"
    )
    assert offending(tmp_path, {"tickets"}) == [f"{planted} imports tickets.retention"]
