"""`make run`'s process manager: honcho (it runs the Procfile), with a stop
window that fits a worker's warm shutdown.

On Ctrl-C honcho sends SIGTERM to every process and SIGKILLs whatever still
runs ``KILL_WAIT`` seconds (5) after the first one exits. A turns worker's
warm shutdown takes longer than that: it interrupts its running turns and
waits their grace, escalating to SIGTERM and SIGKILL of an isolated turn's
process (docs/design.md, "Worker shutdown"); on the embedded filesystem
broker even an idle worker needs 4-7 s. ``RUN_STOP_WAIT_S`` (default 30)
replaces honcho's 5 s; the usage is honcho's own (``start -f Procfile``).

The stop signal goes to each Procfile process itself, not to its process
group (the Procfile ``exec``s, so honcho's pid is the program's): systemd's
``KillMode=mixed``, as the units in ``deploy/systemd`` stop a worker. The
group's SIGTERM reached a Celery worker's idle pool processes as well as its
main process, and billiard's handler makes a second SIGTERM fatal while it
unwinds: 4 of 11 stops of ``make run`` left a pool process dead inside the
pool's queue lock and the main process waiting for it until the SIGKILL
(docs/design.md, "Worker shutdown"). The main process stops its own pool
(and passes SIGTERM to pool processes running a turn). Whatever still runs
``RUN_STOP_WAIT_S`` after the first exit gets SIGKILL, group and all."""

from __future__ import annotations

import errno
import os
import signal
import sys

import honcho.compat
import honcho.manager
from honcho.command import main

# honcho reads this module global on every pass of its stop loop.
honcho.manager.KILL_WAIT = float(os.environ.get("RUN_STOP_WAIT_S", "30"))


def _terminate_main_only(self, pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ESRCH):
            raise


honcho.compat.ProcessManager.terminate = _terminate_main_only

if __name__ == "__main__":
    sys.exit(main())
