"""A database upgraded from the previous release is the database a fresh
``migrate`` makes: tables, indexes, constraints, triggers, functions and
grants, as ``pg_dump --schema-only`` prints them.

The previous release is the newest one CHANGELOG.md lists, by its commit
(a clone may not carry tags). Its tree is exported with ``git archive`` and
migrated with its own code; then this tree migrates the same database. A
migration that only one path runs, a migration that imports today's code
(so a fresh and an upgraded database build a function from different
text), a function changed under the previous release's callers
(``core.sqlfunctions.SignatureChanged``): each shows up as a difference
here or as a failed ``migrate``.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from tests.db_roles import OWNER

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def previous_release() -> tuple[str, str]:
    """(version, commit) of the newest release in CHANGELOG.md."""
    text = (ROOT / "CHANGELOG.md").read_text()
    match = re.search(r"^## \[(\d+\.\d+\.\d+)\][^\n]*\n+Commit `([0-9a-f]{40})`", text, re.M)
    assert match, "CHANGELOG.md names no release with its commit"
    return match.group(1), match.group(2)


def _owner() -> dict[str, str]:
    db = settings.DATABASES["default"]
    return {
        "user": OWNER.get("USER") or db["USER"],
        "password": OWNER.get("PASSWORD") or db.get("PASSWORD") or "",
        "host": db["HOST"] or "127.0.0.1",
        "port": str(db["PORT"] or 5432),
    }


def _url(name: str) -> str:
    o = _owner()
    auth = o["user"] + (f":{o['password']}" if o["password"] else "")
    return f"postgres://{auth}@{o['host']}:{o['port']}/{name}"


def _admin():
    o = _owner()
    return psycopg.connect(
        host=o["host"], port=o["port"], user=o["user"], password=o["password"] or None,
        dbname="postgres", autocommit=True,
    )  # fmt: skip


@pytest.fixture
def scratch():
    """Scratch databases of the test's own, dropped afterwards."""
    made: list[str] = []

    def make() -> str:
        name = f"cc_upgrade_{uuid.uuid4().hex[:10]}"
        with _admin() as conn:
            conn.execute(f"CREATE DATABASE {name}")
        made.append(name)
        return name

    yield make
    with _admin() as conn:
        for name in made:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _migrate(tree: Path, database: str, command: str = "migrate") -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(
        DATABASE_URL=_url(database),
        DATABASE_MIGRATE_URL="",
        DJANGO_SETTINGS_MODULE="config.settings",
        PYTHONPATH=str(tree),
    )
    if settings.DATABASE_APP_ROLE:
        env["DATABASE_APP_ROLE"] = settings.DATABASE_APP_ROLE
    done = subprocess.run(
        [sys.executable, "manage.py", command, *(["--no-input"] if command == "migrate" else []),
         "-v0"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, f"{command} in {tree} failed:\n{done.stdout}\n{done.stderr}"


def _schema(database: str) -> str:
    o = _owner()
    dump = subprocess.run(
        ["pg_dump", "--schema-only", "--no-comments", "-h", o["host"], "-p", o["port"],
         "-U", o["user"], database],
        capture_output=True, text=True, check=True, timeout=120,
        env={**os.environ, "PGPASSWORD": o["password"]},
    ).stdout  # fmt: skip
    # pg_dump's own header, session settings and per-dump \restrict key are
    # not the schema.
    skip = ("--", "SET ", "SELECT pg_catalog.set_config", "\\restrict", "\\unrestrict")
    lines = [line for line in dump.splitlines() if line.strip() and not line.startswith(skip)]
    return "\n".join(lines)


def _export(commit: str, dest: Path) -> Path:
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, timeout=120
    )
    if archive.returncode != 0:
        pytest.fail(
            f"the previous release's commit {commit} is not in this clone "
            f"(git archive: {archive.stderr.decode().strip()}); CI clones main with its history"
        )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def test_an_upgraded_database_equals_a_fresh_one(scratch, tmp_path):
    version, commit = previous_release()
    old_tree = _export(commit, tmp_path / f"release-{version}")

    upgraded = scratch()
    _migrate(old_tree, upgraded)  # the previous release, with its own code
    _migrate(ROOT, upgraded)  # then this one, as an upgrade runs it
    # and its last step (docs/howto/upgrade.md): the functions it retired go.
    _migrate(ROOT, upgraded, "post_deploy")

    fresh = scratch()
    _migrate(ROOT, fresh)

    a, b = _schema(upgraded), _schema(fresh)
    if a != b:
        import difflib

        diff = "\n".join(
            difflib.unified_diff(
                b.splitlines(), a.splitlines(), "fresh", f"upgraded from {version}", lineterm=""
            )
        )
        pytest.fail(f"the upgraded database differs from a fresh one:\n{diff[:6000]}")
