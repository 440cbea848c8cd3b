"""Python runners for the turn-token tests (allowed by the tests' runner
allow-list: ``tests.``). The token they are given is written to a file named
in the input, outside the ledger, so a test can check where it went."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def keeps_its_token(ctx):
    Path(ctx.input["path"]).write_text(ctx.envelope()["turn"]["token"])
    assert ctx.token == ctx.envelope()["turn"]["token"]
    return {"ok": True}


def returns_its_envelope(ctx):
    """A careless runner: hands its whole envelope back as the result."""
    Path(ctx.input["path"]).write_text(ctx.token)
    return {"envelope": ctx.envelope(), "ctx": repr(ctx)}


def logs_its_context(ctx):
    Path(ctx.input["path"]).write_text(ctx.token)
    log.info("running with %r", ctx)
    return {"ok": True}
