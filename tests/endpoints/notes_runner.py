"""A python runner that answers with what its turn was handed of its
endpoint generation: the notes and the number, as TurnContext and the
envelope carry them."""

from __future__ import annotations


def echo_notes(ctx):
    envelope = ctx.envelope()
    return {
        "notes": ctx.notes,
        "generation": ctx.generation,
        "envelope_notes": envelope["notes"],
        "envelope_generation": envelope["turn"]["generation"],
    }
