"""The layers hold for the data as they hold for the imports: no model,
migration, trigger or ``.sql`` file of an app names a table or model of an
app above it (pyproject.toml's "apps" layers contract: config > console >
recovery > runtime > tickets > endpoints > health | accounts > core).

Import-linter checks the imports; this checks what it cannot see: a
foreign key to a higher app's model, a migration depending on a higher
app's migration (or naming its model or table in an operation or SQL), a
trigger whose function reads a higher app's table, a function file
reading one. Then a lower app can be migrated, tested and read without
the apps above it.

Who owns a table is the Django app registry's answer (``db_table`` to app
label), so a table that kept an old name (the ledger's ``runtime_turn``)
belongs to its model's app, not to the prefix of its name. A trigger
belongs to the app whose migration creates it (its ``CREATE TRIGGER``
text), else to its table's app (core/append_only.py's triggers, which a
table's own migration puts on it): the ledger's trigger inserting a new
endpoint's lock row sits on the directory's table and names the ledger's
table, as a receiver of the directory's inserts that the directory never
names.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from django.apps import apps
from django.db import connection, migrations
from django.db.migrations.loader import MigrationLoader

ROOT = Path(__file__).resolve().parents[1]


@cache
def layer_of() -> dict[str, int]:
    """App label → its layer's height (0 is the bottom), from the contract."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "apps"]
    heights = {}
    for height, layer in enumerate(reversed(contract["layers"])):
        for app in layer.split("|"):
            heights[app.strip()] = height
    return heights


def may_name(app: str, other: str) -> bool:
    """Whether ``app`` may name ``other``'s tables: its own, or those of an
    app in a lower layer (siblings of one layer are independent). Apps
    outside the contract (Django's own, third parties) are below all."""
    heights = layer_of()
    if app == other or other not in heights or app not in heights:
        return True
    return heights[other] < heights[app]


@cache
def table_owner() -> dict[str, str]:
    """Table name → the label of the app whose model it is."""
    return {
        model._meta.db_table: model._meta.app_label
        for model in apps.get_models(include_auto_created=True)
    }


def tables_named(text: str) -> set[str]:
    """The project's tables a text names (as whole words)."""
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    return words & set(table_owner())


def _strip_sql_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


def _code_strings(source: str) -> str:
    """Every string constant of a module but its docstrings: what it could
    run as SQL (prose about another app's tables is no data arrow)."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return "\n".join(
        _strip_sql_comments(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
    )


def _imported_packages(source: str) -> set[str]:
    tree = ast.parse(source)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def _layered_apps() -> list:
    return [a for a in apps.get_app_configs() if a.label in layer_of()]


def _operations(operations) -> Iterator[migrations.operations.base.Operation]:
    for operation in operations:
        yield operation
        if isinstance(operation, migrations.SeparateDatabaseAndState):
            yield from _operations(operation.database_operations)
            yield from _operations(operation.state_operations)


def _related_labels(operation) -> Iterator[str]:
    """The app labels of the models an operation's fields point to."""
    fields = []
    if isinstance(operation, migrations.CreateModel):
        fields = [field for _, field in operation.fields]
    elif isinstance(operation, migrations.AddField | migrations.AlterField):
        fields = [operation.field]
    for field in fields:
        remote = getattr(field, "remote_field", None)
        if remote is None:
            continue
        target = remote.model
        if isinstance(target, str):
            yield target.split(".")[0].lower()
        else:
            yield target._meta.app_label


def violations_of_models() -> list[str]:
    found = []
    for model in apps.get_models(include_auto_created=True):
        app = model._meta.app_label
        for field in model._meta.get_fields():
            if not field.is_relation or field.auto_created or field.related_model is None:
                continue
            other = field.related_model._meta.app_label
            if not may_name(app, other):
                found.append(
                    f"{model._meta.label}.{field.name} -> {field.related_model._meta.label}"
                )
    return found


def violations_of_migrations() -> list[str]:
    found = []
    loader = MigrationLoader(None, ignore_no_migrations=True, load=False)
    loader.load_disk()
    owners = table_owner()
    for (app, name), migration in sorted(loader.disk_migrations.items()):
        where = f"{app}/migrations/{name}"
        for dep_app, dep_name in migration.dependencies:
            if not may_name(app, dep_app):
                found.append(f"{where} depends on {dep_app}.{dep_name}")
        for operation in _operations(migration.operations):
            for other in _related_labels(operation):
                if not may_name(app, other):
                    found.append(f"{where}: {type(operation).__name__} points to {other}")
        source = Path(__import__(migration.__module__, fromlist=["_"]).__file__).read_text()
        for table in sorted(tables_named(_code_strings(source))):
            if not may_name(app, owners[table]):
                found.append(f"{where} names {table} ({owners[table]})")
        for package in sorted(_imported_packages(source)):
            if not may_name(app, package):
                found.append(f"{where} imports {package}")
    return found


def violations_of_sql_files() -> list[str]:
    found = []
    owners = table_owner()
    for config in _layered_apps():
        for path in sorted(Path(config.path).glob("sql/*.sql")):
            text = _strip_sql_comments(path.read_text())
            for table in sorted(tables_named(text)):
                if not may_name(config.label, owners[table]):
                    found.append(f"{config.label}/sql/{path.name} names {table} ({owners[table]})")
    return found


def trigger_creators() -> dict[str, str]:
    """Trigger name → the app whose migration's SQL creates it by name."""
    creators = {}
    loader = MigrationLoader(None, ignore_no_migrations=True, load=False)
    loader.load_disk()
    for (app, _), migration in loader.disk_migrations.items():
        source = Path(__import__(migration.__module__, fromlist=["_"]).__file__).read_text()
        for name in re.findall(r"CREATE\s+TRIGGER\s+(\w+)", _code_strings(source), re.I):
            creators[name] = app
    return creators


_TRIGGERS = """
SELECT t.tgname, c.relname, p.prosrc
FROM pg_catalog.pg_trigger t
JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
WHERE NOT t.tgisinternal AND c.relnamespace = pg_catalog.current_schema()::regnamespace
"""


def violations_of_triggers() -> list[str]:
    found = []
    owners = table_owner()
    creators = trigger_creators()
    with connection.cursor() as cur:
        cur.execute(_TRIGGERS)
        triggers = cur.fetchall()
    assert triggers, "the test database has no trigger: nothing was checked"
    for trigger, table, body in triggers:
        app = creators.get(trigger) or owners.get(table)
        if app is None:
            continue
        for named in sorted({table} | tables_named(_strip_sql_comments(body))):
            if not may_name(app, owners[named]):
                found.append(
                    f"trigger {trigger} of {app} on {table} names {named} ({owners[named]})"
                )
    return found


def test_the_layers_are_read_from_the_contract():
    heights = layer_of()
    assert heights["core"] < heights["endpoints"] < heights["tickets"] < heights["runtime"]
    assert heights["health"] == heights["accounts"]
    assert not may_name("tickets", "runtime") and may_name("runtime", "tickets")
    assert not may_name("health", "accounts") and may_name("tickets", "auth")
    # The ledger's tables keep their old names and are the ledger's.
    assert table_owner()["runtime_turn"] == "tickets"
    assert table_owner()["runtime_worker"] == "runtime"


def test_no_model_points_up():
    assert violations_of_models() == []


def test_no_migration_depends_on_or_names_a_higher_app():
    assert violations_of_migrations() == []


def test_no_sql_file_reads_a_higher_app():
    assert violations_of_sql_files() == []


@pytest.mark.django_db
def test_no_trigger_names_a_higher_app():
    assert violations_of_triggers() == []


def test_the_checks_can_fail(monkeypatch):
    """Each check finds an arrow up when one is there: the layers seen
    upside down make every reference to a lower app one."""
    heights = layer_of()
    top = max(heights.values())
    monkeypatch.setattr(
        "tests.test_data_layers.layer_of", lambda: {app: top - h for app, h in heights.items()}
    )
    assert any("tickets.Ticket.endpoint" in v for v in violations_of_models())
    assert any("depends on endpoints" in v for v in violations_of_migrations())
    assert any("tickets/sql/claimcheck_admit_v2.sql names" in v for v in violations_of_sql_files())
    # recovery's folder is read too: its trigger function names the ledger's hold.
    assert (
        "recovery/sql/claimcheck_recovery_hold.sql names tickets_retentionhold (tickets)"
        in violations_of_sql_files()
    )


@pytest.mark.django_db
def test_the_trigger_check_can_fail(monkeypatch):
    """Upside down, a trigger of a higher app that writes a lower app's
    table (recovery's retention hold in the ledger) is an arrow up."""
    heights = layer_of()
    top = max(heights.values())
    monkeypatch.setattr(
        "tests.test_data_layers.layer_of", lambda: {app: top - h for app, h in heights.items()}
    )
    assert (
        "trigger recovery_recoverycase_retention_hold of recovery on recovery_recoverycase "
        "names tickets_retentionhold (tickets)"
    ) in violations_of_triggers()
