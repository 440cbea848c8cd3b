"""A private PostgreSQL cluster and a private Redis that fault tests may stop,
restart and kill. Never the machine's own (127.0.0.1:5432 and :6379): other
people's tests run there.

PostgreSQL refuses to run as root, so the cluster belongs to the
``postgres`` OS user (``runuser``) when the tests run as root; its directory
is a fresh one under the system temp dir (pytest's own tmp dir is private to
root). Both listen on 127.0.0.1 only, on free ports, and are removed at the
end of the session. The cluster is scripts/pglaunch.py's, as `make run`'s
and tests/test_db_outage.py's are.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

from scripts import pglaunch
from scripts.pglaunch import free_port
from tests.waiting import wait_for

__all__ = ["PrivatePostgres", "PrivateRedis", "available", "free_port"]


def available() -> bool:
    """The server binaries are installed, and, as root, a ``postgres`` user
    to run them as."""
    try:
        pglaunch.bindir()
        if os.geteuid() == 0:
            pwd.getpwnam("postgres")
    except (pglaunch.NotFound, KeyError):
        return False
    return True


def _wait(predicate, *, timeout: float, what: str) -> None:
    wait_for(predicate, timeout=timeout, interval=0.1, message=what)


class PrivatePostgres(pglaunch.Cluster):
    """``initdb`` in a temp dir, ``pg_ctl start|stop|restart`` on a free port,
    ``kill`` (SIGKILL to the postmaster): scripts/pglaunch.py with the
    machine's binaries, as the ``postgres`` OS user when we are root."""

    def __init__(self, port: int | None = None) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="cc-faults-pg-"))
        user = "postgres" if os.geteuid() == 0 else None
        if user:
            # The server will not run as root: hand the directory to postgres.
            entry = pwd.getpwnam(user)
            os.chown(self.base, entry.pw_uid, entry.pw_gid)
        super().__init__(self.base / "data", pglaunch.bindir(), user=user)
        self.port = port or free_port()

    def init(self) -> PrivatePostgres:
        # A scratch cluster: durability is not what these tests measure (a
        # restart here is a clean or fast shutdown, never a machine crash).
        self.initdb(
            sync=False,
            conf={
                "max_connections": "300",
                "fsync": "off",
                "synchronous_commit": "off",
                "full_page_writes": "off",
                "jit": "off",
            },
        )
        return self

    def is_up(self) -> bool:
        return self.ready()

    def execute(self, sql: str, db: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(self.url(db), autocommit=True) as conn:
            conn.execute(sql)

    def createdb(self, name: str) -> str:
        self.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            if self.pid() is not None and self.running():
                self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PrivatePostgres:
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()


class PrivateRedis:
    """``redis-server`` without persistence on a free port: a restart loses
    every message, which is exactly the fault."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.base = Path(tempfile.mkdtemp(prefix="cc-faults-redis-"))
        self.pidfile = self.base / "redis.pid"

    def start(self) -> None:
        subprocess.run(
            [
                "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--daemonize", "yes",
                "--dir", str(self.base), "--pidfile", str(self.pidfile),
                "--logfile", str(self.base / "redis.log"),
            ],
            check=True,
            capture_output=True,
        )  # fmt: skip
        _wait(self.is_up, timeout=20, what=f"redis on port {self.port}")

    def pid(self) -> int | None:
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """Shut down at once (no save: there is nothing to keep)."""
        pid = self.pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)

        def gone() -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False

        _wait(gone, timeout=20, what="redis to stop")
        self.pidfile.unlink(missing_ok=True)

    def is_up(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def flush(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(b"FLUSHALL\r\n")
            assert s.recv(16).startswith(b"+OK")

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        shutil.rmtree(self.base, ignore_errors=True)
