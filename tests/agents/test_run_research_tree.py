"""examples/run_research.py prints the trace as a tree: each ticket under its
parent, and the callback that brings a child's answer home (a ticket on
the asking endpoint, admitted as the child's own child) marked "callback
for" that child, as the console's trace marks it."""

from __future__ import annotations

from claimcheck_client import LineageNode
from examples.run_research import print_tree


def test_the_trace_prints_as_a_tree_with_its_callbacks_marked(capsys):
    def node(id_, parent, endpoint, depth):
        return LineageNode(id=id_, parent=parent, endpoint=endpoint, state="succeeded", depth=depth)

    # The lineage's order: by depth, so both callbacks come after both children.
    print_tree(
        [
            node("r", None, "ex.research", 0),
            node("s", "r", "ex.search", 1),
            node("m", "r", "ex.summarize", 1),
            node("cm", "m", "ex.research", 2),
            node("cs", "s", "ex.research", 2),
        ]
    )
    assert capsys.readouterr().out.splitlines() == [
        "  ex.research: succeeded",
        "    ex.search: succeeded",
        "      ex.research: succeeded  (callback for ex.search)",
        "    ex.summarize: succeeded",
        "      ex.research: succeeded  (callback for ex.summarize)",
    ]
