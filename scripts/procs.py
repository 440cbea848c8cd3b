"""`make run`'s process manager: honcho (it runs the Procfile), with a stop
window that fits a worker's warm shutdown.

On Ctrl-C honcho sends SIGTERM to every process and SIGKILLs whatever still
runs ``KILL_WAIT`` seconds (5) after the first one exits. A turns worker's
warm shutdown takes longer than that: it interrupts its running turns and
waits their grace, escalating to SIGTERM and SIGKILL of an isolated turn's
process (docs/design.md, "Worker shutdown"); on the embedded filesystem
broker even an idle worker needs 4-7 s. ``RUN_STOP_WAIT_S`` (default 30)
replaces honcho's 5 s; the usage is honcho's own (``start -f Procfile``)."""

from __future__ import annotations

import os
import sys

import honcho.manager
from honcho.command import main

# honcho reads this module global on every pass of its stop loop.
honcho.manager.KILL_WAIT = float(os.environ.get("RUN_STOP_WAIT_S", "30"))

if __name__ == "__main__":
    sys.exit(main())
