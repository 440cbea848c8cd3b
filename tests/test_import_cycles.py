"""No module of the project imports itself back, directly or through others,
function-local imports included: import-linter's ``acyclic_siblings``
contract (pyproject.toml, id ``acyclic``), which `make test` and `make lint`
check with the other contracts. These tests hold the contract to that job:
it covers every root package, and it fails on a planted cycle."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def test_the_acyclic_contract_covers_every_root_package():
    config = _config()
    (contract,) = [c for c in config["contracts"] if c.get("id") == "acyclic"]
    assert contract["type"] == "acyclic_siblings"
    assert sorted(contract["ancestors"]) == sorted(config["root_packages"])


def test_a_planted_cycle_breaks_the_contract(tmp_path: Path):
    pkg = tmp_path / "planted"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from planted import b\n")
    (pkg / "b.py").write_text(
        textwrap.dedent(
            """
            def late():
                from planted.sub import c  # function-local: still an import
            """
        )
    )
    (pkg / "sub" / "c.py").write_text("import planted.a\n")
    (tmp_path / ".importlinter").write_text(
        textwrap.dedent(
            """
            [importlinter]
            root_package = planted

            [importlinter:contract:acyclic]
            name = planted is acyclic
            type = acyclic_siblings
            ancestors = planted
            """
        )
    )

    def lint() -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=120,
        )

    broken = lint()
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "No cycles are allowed in planted" in broken.stdout
    # The same package without the function-local import back is kept.
    (pkg / "b.py").write_text("")
    kept = lint()
    assert kept.returncode == 0, kept.stdout + kept.stderr
