"""No module of the project imports itself back, directly or through others,
function-local imports included (grimp, import-linter's graph, reads every
import statement in a module, wherever it stands). The layers between the
packages are import-linter's contracts (pyproject.toml); this is the rule
inside them."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import grimp

PACKAGES = (
    "core",
    "accounts",
    "config",
    "tickets",
    "endpoints",
    "runtime",
    "recovery",
    "console",
    "health",
)


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every group of modules that import each other in a circle (the
    strongly connected components of more than one module), each with the
    circle's imports for the failure message."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        # Tarjan's algorithm, iteratively: (module, position in its edges).
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            if i < len(edges.get(node, ())):
                work.append((node, i + 1))
                nxt = edges[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def describe(graph: grimp.ImportGraph, group: list[str]) -> str:
    lines = []
    for a in group:
        for b in graph.find_modules_directly_imported_by(a):
            if b in group:
                for d in graph.get_import_details(importer=a, imported=b):
                    lines.append(f"  {a}:{d['line_number']}  {d['line_contents']}")
    return "\n".join([" <-> ".join(group), *sorted(lines)])


def test_no_module_of_the_project_imports_itself_back():
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n\n".join(describe(graph, g) for g in found)


def test_a_planted_cycle_is_found(tmp_path: Path, monkeypatch):
    pkg = tmp_path / "planted"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from planted import b\n")
    (pkg / "b.py").write_text(
        textwrap.dedent(
            """
            def late():
                from planted import c  # function-local: still an import
            """
        )
    )
    (pkg / "c.py").write_text("import planted.a\n")
    (pkg / "d.py").write_text("import planted.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        graph = grimp.build_graph("planted", include_external_packages=False, cache_dir=None)
    finally:
        sys.modules.pop("planted", None)
    assert cycles(graph) == [["planted.a", "planted.b", "planted.c"]]
