"""Python runners for tests/tickets/test_child_rights.py."""

from __future__ import annotations

from runtime.runners import Child, TurnContext, Wait


def targets(ctx: TurnContext) -> Wait:
    """One child on each of ``input.targets``, in order, in one wait."""
    return Wait(
        children=[Child(endpoint=t, input={"part": i}) for i, t in enumerate(ctx.input["targets"])],
        continuation={"ticket": str(ctx.ticket_id)},
    )
