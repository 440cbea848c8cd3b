"""A private PostgreSQL cluster and a private Redis that fault tests may stop,
restart and kill. Never the machine's own (127.0.0.1:5432 and :6379): other
people's tests run there.

PostgreSQL refuses to run as root, so the cluster belongs to the
``postgres`` OS user (``runuser``) when the tests run as root; its directory
is a fresh one under the system temp dir (pytest's own tmp dir is private to
root). Both listen on 127.0.0.1 only, on free ports, and are removed at the
end of the session.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.waiting import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bindir() -> Path:
    for candidate in (os.environ.get("FAULTS_PG_BINDIR", ""), *sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), reverse=True
    )):  # fmt: skip
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise RuntimeError(
        "the fault tests need PostgreSQL's server binaries (initdb, pg_ctl): install "
        "postgresql or set FAULTS_PG_BINDIR"
    )


def _wait(predicate, *, timeout: float, what: str) -> None:
    wait_for(predicate, timeout=timeout, interval=0.1, message=what)


class PrivatePostgres:
    """``initdb`` in a temp dir, ``pg_ctl start|stop|restart`` on a free port."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.bindir = _pg_bindir()
        self.base = Path(tempfile.mkdtemp(prefix="cc-faults-pg-"))
        self.data = self.base / "data"
        self.logfile = self.base / "postgres.log"
        self._as: list[str] = []
        if os.geteuid() == 0:
            # The server will not run as root: hand the directory to postgres.
            user = pwd.getpwnam("postgres")
            os.chown(self.base, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self._as, *args], check=True, capture_output=True, text=True, timeout=timeout
        )

    def init(self) -> PrivatePostgres:
        self._run(
            str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
            "--no-sync", "-E", "UTF8",
        )  # fmt: skip
        # A scratch cluster: durability is not what these tests measure (a
        # restart here is a clean or fast shutdown, never a machine crash).
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# fault tests\n"
                "listen_addresses = '127.0.0.1'\n"
                "max_connections = 300\n"
                "fsync = off\n"
                "synchronous_commit = off\n"
                "full_page_writes = off\n"
                "jit = off\n"
            )
        return self

    def start(self) -> None:
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.logfile),
            "-o", f"-p {self.port} -k {self.base}", "-w", "-t", "60", "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """``fast`` ends every session and shuts down cleanly; ``immediate``
        is a crash (recovery on the next start)."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, down_s: float = 0.0, mode: str = "fast") -> None:
        self.stop(mode)
        if down_s:
            time.sleep(down_s)  # the behaviour under test: the server down this long
        self.start()

    def is_up(self) -> bool:
        done = subprocess.run(
            [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"],
            check=False,
        )
        return done.returncode == 0

    def url(self, db: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def execute(self, sql: str, db: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(self.url(db), autocommit=True) as conn:
            conn.execute(sql)

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            if (self.data / "postmaster.pid").exists():
                self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


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
