"""Python runners for the runner-user tests (allowed by the tests' runner
allow-list: ``tests.``): each reports what the turn's process could reach of
its worker."""

from __future__ import annotations

import os


def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode(errors="replace").replace("\0", "\n")
    except OSError as exc:
        return type(exc).__name__


def reaches(ctx) -> dict:
    from core import secrets

    try:
        named = secrets.secret(ctx.input["secret"])
    except secrets.SecretMissing:
        named = "SecretMissing"
    return {
        "uid": os.getuid(),
        "env": dict(os.environ),
        "supervisor_environ": _read(f"/proc/{os.getppid()}/environ"),
        "own_environ": _read("/proc/self/environ"),
        "secrets_file": _read(ctx.input["secrets_file"]),
        "secret": named,
    }


def ignores_sigterm(ctx) -> dict:
    """Ignores its interrupt and SIGTERM: only SIGKILL stops it."""
    import signal
    import time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)  # the behaviour under test: a turn that will not stop
    return {"uid": os.getuid()}
