"""Every repository path a comment, docstring or document names exists: a
file moved or removed takes its mentions with it. A path counts when its
first part is one of the repository's top-level folders; templates are named
as Django finds them (under templates/); generated files are left out."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATH = re.compile(
    r"\b[a-z_]+(?:/[A-Za-z_0-9.-]+)+\.(?:py|md|sql|html|css|js|toml|sh|conf|json|lua|yml)\b"
)
# Written by runs, not kept in the repository.
GENERATED = ("var/", "bench/results/")


def named_paths() -> dict[str, set[str]]:
    files = subprocess.run(
        ["git", "ls-files", "*.py", "*.md", "*.toml", "Makefile", "*.sh", "*.conf"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    tops = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    found: dict[str, set[str]] = {}
    for name in files:
        text = (ROOT / name).read_text(errors="replace")
        for path in PATH.findall(text):
            if path.split("/", 1)[0] in tops and not path.startswith(GENERATED):
                found.setdefault(path, set()).add(name)
    return found


def test_every_named_path_exists():
    found = named_paths()
    assert len(found) > 100, "the scan found too few paths to be reading the tree"
    missing = {
        path: sorted(where)
        for path, where in found.items()
        if not (ROOT / path).exists() and not (ROOT / "templates" / path).exists()
    }
    assert not missing, "paths named but not in the repository:\n" + "\n".join(
        f"  {path}  (named in {', '.join(where)})" for path, where in sorted(missing.items())
    )
