"""A private PostgreSQL cluster that a fault test may stop and restart.

Never touch the machine's cluster (127.0.0.1:5432): other people's tests run
there. This one lives in a fresh directory under /tmp, is owned by the
``postgres`` OS user (initdb refuses to run as root), listens on 127.0.0.1 on
a free port from 55432 up, keeps its Unix socket in its own directory, and
trades durability for speed (``fsync=off``: it is thrown away).

    from tests.pgcluster import PgCluster, migrate

    with PgCluster.create() as pg:          # initdb + start
        url = pg.createdb("claimcheck")     # postgres://postgres@127.0.0.1:<port>/claimcheck
        migrate(url)                        # manage.py migrate into it
        pg.stop()                           # "-m fast": sessions are terminated
        pg.start()
        pg.restart()
    # stopped and deleted

``available()`` says whether the binaries are installed (skip otherwise).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
FIRST_PORT = 55432
ROOT = Path(__file__).resolve().parent.parent


def available() -> bool:
    """The server binaries are installed and we can act as ``postgres``."""
    if not (PG_BIN / "initdb").exists() or not (PG_BIN / "pg_ctl").exists():
        return False
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return False
    return os.geteuid() == 0 or pwd.getpwuid(os.geteuid()).pw_name == "postgres"


def _as_postgres(*argv: str | Path) -> list[str]:
    cmd = [str(a) for a in argv]
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class PgCluster:
    """One private cluster: ``create()``, ``start()``, ``stop()``,
    ``restart()``, ``url()``, ``createdb()``, ``destroy()``."""

    def __init__(self, directory: Path, port: int) -> None:
        self.dir = directory
        self.data = directory / "data"
        self.port = port
        self.logfile = directory / "server.log"

    # --- life cycle ---------------------------------------------------------------------

    @classmethod
    def create(cls, *, port: int | None = None, start: bool = True) -> PgCluster:
        """initdb into a new directory and (by default) start it on ``port``,
        or on the first free port from 55432 up."""
        directory = Path(tempfile.mkdtemp(prefix="ccpg-", dir="/tmp"))
        pw = pwd.getpwnam("postgres")
        os.chown(directory, pw.pw_uid, pw.pw_gid)
        os.chmod(directory, 0o700)
        cluster = cls(directory, port or 0)
        try:
            subprocess.run(
                _as_postgres(
                    PG_BIN / "initdb",
                    "-D",
                    cluster.data,
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "--no-sync",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                ),
                check=True,
                capture_output=True,
            )
            if start:
                cluster._start_on_free_port(port)
        except BaseException:
            cluster.destroy()
            raise
        return cluster

    def _start_on_free_port(self, port: int | None) -> None:
        candidates = [port] if port else range(FIRST_PORT + os.getpid() % 50, FIRST_PORT + 400)
        last_error = ""
        for candidate in candidates:
            if not _port_free(candidate):
                continue
            self.port = candidate
            try:
                self.start()
                return
            except subprocess.CalledProcessError:  # lost a race for the port
                last_error = self.log_tail()
        raise RuntimeError(f"could not start a private PostgreSQL: {last_error}")

    def start(self, timeout: int = 60) -> None:
        """Start and wait until it accepts connections."""
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        subprocess.run(
            _as_postgres(
                PG_BIN / "pg_ctl",
                "-D",
                self.data,
                "-l",
                self.logfile,
                "-o",
                options,
                "-w",
                "-t",
                str(timeout),
                "start",
            ),
            check=True,
            capture_output=True,
        )

    def stop(self, mode: str = "fast", timeout: int = 60) -> None:
        """Stop: ``fast`` terminates the sessions ("terminating connection due
        to administrator command"), ``immediate`` is a crash."""
        subprocess.run(
            _as_postgres(
                PG_BIN / "pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", str(timeout), "stop"
            ),
            check=True,
            capture_output=True,
        )

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def running(self) -> bool:
        return (
            subprocess.run(
                _as_postgres(PG_BIN / "pg_ctl", "-D", self.data, "status"), capture_output=True
            ).returncode
            == 0
        )

    def destroy(self) -> None:
        """Stop (as a crash: nothing to keep) and delete the directory."""
        if self.data.exists() and self.running():
            with contextlib.suppress(subprocess.CalledProcessError):
                self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    # --- using it -----------------------------------------------------------------------

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def createdb(self, name: str) -> str:
        """Create a database; returns its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def log_tail(self, lines: int = 20) -> str:
        if not self.logfile.exists():
            return ""
        return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])


def migrate(database_url: str, env: dict[str, str] | None = None) -> None:
    """``manage.py migrate`` into ``database_url`` (a subprocess: this
    process's Django stays on its own database)."""
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v0"],
        cwd=ROOT,
        env={**os.environ, **(env or {}), "DATABASE_URL": database_url},
        check=True,
        capture_output=True,
    )
