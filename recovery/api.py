"""Recovery routes (filled in by the recovery issue)."""

from ninja import Router

router = Router(tags=["recovery"])
