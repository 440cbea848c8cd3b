"""The settings reference (docs/reference/settings.md) and the code agree: every
environment variable config/settings.py reads has a row, and every variable a
row names is read by the file its "read by" column names. A new setting
without a row fails here, as does a row left behind by a removed one."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = "config/settings.py"
REFERENCE = ROOT / "docs" / "reference" / "settings.md"

NAME = r"[A-Z][A-Z0-9_]*"
# django-environ's readers (env.str("X", ...), env.int(\n "X", ...), env("X")),
# and the standard library's (os.environ.get("X"), os.environ["X"], os.getenv("X")).
READS = re.compile(
    rf"""(?:\benv(?:\.[a-z_]+)?\(\s*|os\.environ(?:\.get\(|\[)\s*|os\.getenv\(\s*)["']({NAME})["']"""
)
# A reader the "read by" column names that is not a repository file: the
# variable is read by a library, and the file in brackets hands it on.
BRACKETED = re.compile(r"\(([^)]+)\)")


def reads(path: str) -> set[str]:
    return set(READS.findall((ROOT / path).read_text()))


def reference_rows() -> list[tuple[set[str], str]]:
    """(variables, read by) of each row of the reference's table."""
    rows = []
    for line in REFERENCE.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 4, f"a row of the settings table without four cells: {line}"
        names = set(re.findall(rf"`({NAME})`", cells[0]))
        assert names, f"a row of the settings table that names no variable: {line}"
        rows.append((names, cells[3]))
    return rows


def test_the_reader_sees_every_kind_of_read():
    found = READS.findall(
        'a = env.int("A_1", default=1)\n'
        'b = env.int(\n    "B", default=2)\n'
        'c = os.environ.get("C")\n'
        'd = os.environ["D"]\n'
        'e = os.getenv("E")\n'
        'f = env("F")\n'
    )
    assert found == ["A_1", "B", "C", "D", "E", "F"]


def test_every_setting_read_has_a_row():
    read = reads(SETTINGS)
    assert len(read) > 60, "the scan found too few reads to be reading the settings"
    documented = {
        name for names, reader in reference_rows() if reader == SETTINGS for name in names
    }
    missing = sorted(read - documented)
    assert not missing, (
        f"{SETTINGS} reads variables docs/reference/settings.md has no row for "
        f"(read by {SETTINGS}): {missing}"
    )


def test_every_documented_setting_is_read():
    rows = reference_rows()
    assert len(rows) > 50
    stale = []
    for names, reader in rows:
        inner = BRACKETED.search(reader)
        path = inner.group(1) if inner else reader
        assert (ROOT / path).is_file(), f"the reference names a reader that is not a file: {reader}"
        if inner:
            # Read by a library: the file named must at least name the variable.
            text = (ROOT / path).read_text()
            stale += [(name, reader) for name in sorted(names) if name not in text]
        else:
            stale += [(name, reader) for name in sorted(names - reads(path))]
    assert not stale, (
        "docs/reference/settings.md documents variables their reader does not read: "
        + ", ".join(f"{name} ({reader})" for name, reader in stale)
    )
