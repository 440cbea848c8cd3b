"""Shared fixtures: real PostgreSQL (pytest-django's test database), real
Redis, and real Celery worker and beat processes for integration tests."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent

# --- Database roles (tests/db_roles.py): the test database is created and
# migrated as the owner role; in-process code and the Celery processes below
# connect as the application role (DATABASE_APP_ROLE, set by `make test`).
from tests import cpu_usage  # noqa: E402
from tests.db_roles import django_db_setup, owner_cursor  # noqa: E402,F401 - fixtures
from tests.faults import figures as fault_figures  # noqa: E402
from tests.waiting import wait_for  # noqa: E402,F401 - the one wait helper, imported from here


def pytest_runtest_logreport(report):
    fault_figures.collect(report)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    fault_figures.summarise(terminalreporter)


def pytest_addoption(parser):
    cpu_usage.pytest_addoption(parser)


# Each test file's seconds in a full run (the ``test_s`` of a
# ``--cpu-report``): the slowest files are collected first, so that with
# ``--dist loadfile`` the workers end on short files rather than one waiting
# on a long one. Refresh after a full quiet run of ``make test
# PYTEST_ARGS="--cpu-report var/cpu.json"`` with ``python -m tests.cpu_usage
# var/cpu.json``; a file it does not name counts as a short one.
FILE_SECONDS = ROOT / "tests" / "file_seconds.json"


def pytest_collection_modifyitems(session, config, items):
    seconds = cpu_usage.file_seconds(FILE_SECONDS)
    # A stable sort: a file's tests stay together and in their order.
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::", 1)[0], 0.0))


def pytest_configure(config):
    cpu_usage.pytest_configure(config)
    # pytest-xdist's loadfile scheduler hands out files in the order the
    # collection has them only without its own reordering, which is on by
    # default and sorts files by their number of tests: the few-test long
    # files (the fault suite, the schema fuzz, make run's test) went last,
    # and one worker ran them alone while the others had finished.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        raise pytest.UsageError(
            "the test suite runs against PostgreSQL: use `make test` or set DATABASE_URL"
        )
    _own_broker_per_xdist_worker()
    _fair_share_off()


# The fair-share limits (core/fairshare.py) as the suite runs: off, since
# many tests admit tickets and wait on them faster and more at once than a
# production caller may. Tests of the limits turn them on (the ``settings``
# fixture in-process, the environment of the servers they start).
FAIR_SHARE_OFF = {
    "RATE_LIMIT_ADMISSIONS": "",
    "RATE_LIMIT_CONCURRENT_REQUESTS": 0,
    "RATE_LIMIT_CONCURRENT_WAITS": 0,
    "RATE_LIMIT_FAILED_AUTH": "",
    "API_WAIT_SLOTS": 64,
}


def _fair_share_off() -> None:
    for name, value in FAIR_SHARE_OFF.items():
        os.environ.setdefault(name, str(value))
        setattr(settings, name, type(value)(os.environ[name]))


def _own_broker_per_xdist_worker() -> None:
    """Under pytest-xdist (`make test` runs TEST_WORKERS of them) each worker has its
    own test database (pytest-django adds ``_gw0``, ``_gw1``) and here its own
    Redis database: gw0 keeps CELERY_BROKER_URL's, gwN takes the one N below.
    Tests purge their broker and start Celery processes on it; a shared one
    would hand one worker's turns to the other's processes."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not settings.CELERY_BROKER_URL.startswith("redis://"):
        return
    from urllib.parse import urlsplit, urlunsplit

    from config.celery import app

    parts = urlsplit(settings.CELERY_BROKER_URL)
    base = int(parts.path.strip("/") or 0)
    own = (base - int(worker[2:])) % 16
    url = urlunsplit(parts._replace(path=f"/{own}"))
    settings.CELERY_BROKER_URL = url
    settings.RATE_LIMIT_STORAGE_URL = url  # the fair-share counters beside it
    # Celery derives the read and write URLs from broker_url once configured.
    app.conf.update(broker_url=url, broker_read_url=url, broker_write_url=url)


# The runner allow-list the tests need (CONTRIBUTING.md, "The test suite"): the demo runners,
# runners under tests/, and commands run by this interpreter. The worker
# processes get the same lists through _test_env.
TEST_RUNNER_PYTHON_PREFIXES = ["runtime.demo.", "tests."]
TEST_RUNNER_COMMANDS = [sys.executable]
TEST_RUNNER_SECRET = "worker-held-secret-value"


@pytest.fixture(autouse=True)
def _runner_allow_list(settings):
    settings.RUNNER_PYTHON_ALLOWED_PREFIXES = TEST_RUNNER_PYTHON_PREFIXES
    settings.RUNNER_COMMAND_ALLOWED = TEST_RUNNER_COMMANDS
    # Turns run as the test process's user (tests/endpoints/test_runner_user.py
    # switches): this interpreter may live where another user cannot enter.
    settings.RUNNER_USER = ""


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    """A test's users get MD5 password hashes: the production hasher is
    slow on purpose, which on a suite bound by CPU made most of the time of
    the console and API files, and no test measures it. Processes a test
    starts (workers, gunicorn) keep the production setting."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _static_files_found_on_request(settings):
    """The test client builds Django's handler, and so WhiteNoise's
    middleware, for every test: with ``WHITENOISE_USE_FINDERS`` each
    instance walks every static file of every finder, a large part of a
    short test such as the authorisation matrix's. A process builds it once.
    Here static files are looked up when one is asked for, as ``runserver``
    does with DEBUG."""
    settings.WHITENOISE_AUTOREFRESH = True


@pytest.fixture(autouse=True)
def _fresh_api_key_cache():
    """Each test starts with no verified key remembered (accounts/keys.py):
    a test's database is rolled back, the process-wide cache is not."""
    from accounts.keys import key_cache

    key_cache.clear()
    yield
    key_cache.clear()


@pytest.fixture(autouse=True)
def _fresh_turn_processes():
    """A warm turn process (runtime/isolation.py) forked during one test
    keeps that test's settings and patches: the next test forks its own."""
    yield
    isolation = sys.modules.get("runtime.isolation")
    if isolation is not None:
        isolation.retire_idle()


@pytest.fixture
def staff_user(django_user_model):
    return django_user_model.objects.create_user("staff", password="pw", is_staff=True)


@pytest.fixture
def api_key(staff_user):
    from accounts.keys import create_api_key

    _, key = create_api_key(username=staff_user.username)
    return key


@pytest.fixture
def api(client, api_key):
    """A Django test client that speaks JSON with a staff API key."""

    class Api:
        def __init__(self, key):
            self.key = key

        def _headers(self, headers):
            return {"HTTP_AUTHORIZATION": f"Bearer {self.key}", **(headers or {})}

        def get(self, path, headers=None, **params):
            return client.get(f"/api/v1{path}", params, **self._headers(headers))

        def post(self, path, body=None, headers=None, raw=None):
            data = raw if raw is not None else __import__("json").dumps(body or {})
            return client.post(
                f"/api/v1{path}", data, content_type="application/json", **self._headers(headers)
            )

        def patch(self, path, body=None, headers=None):
            return client.patch(
                f"/api/v1{path}",
                __import__("json").dumps(body or {}),
                content_type="application/json",
                **self._headers(headers),
            )

        def as_key(self, key):
            return Api(key)

    return Api(api_key)


@pytest.fixture
def make_endpoint(db):
    from endpoints.services import create_endpoint

    counter = iter(range(10_000))

    def make(address=None, path="runtime.demo.echo", runner=None, isolation=None, **kw):
        # demo.stuck shows quarantine: it runs inline unless a test says otherwise.
        if isolation is None and path == "runtime.demo.stuck":
            isolation = "inline"
        extra = {"isolation": isolation} if isolation else {}
        return create_endpoint(
            address=address or f"test.ep-{next(counter)}",
            runner=runner or {"kind": "python", "path": path, **extra},
            **kw,
        )

    return make


# --- Real worker processes -----------------------------------------------------------------


def _test_env() -> dict[str, str]:
    db = settings.DATABASES["default"]  # USER: the application role (tests/db_roles.py)
    env = dict(os.environ)
    env["DATABASE_URL"] = (
        f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{connection.settings_dict['NAME']}"
    )
    env["CELERY_BROKER_URL"] = settings.CELERY_BROKER_URL
    env["RATE_LIMIT_STORAGE_URL"] = settings.RATE_LIMIT_STORAGE_URL
    env["SWEEP_INTERVAL_S"] = "0.5"
    env["REDISPATCH_AFTER_S"] = "1"
    env["WORKER_HEARTBEAT_S"] = "0.5"
    # Connections kept between tasks, as in production (DB_CONN_MAX_AGE's
    # default): a new PostgreSQL session for every task, every sweep
    # included, was a large share of the CPU a worker's test costs (server
    # and worker alike). A test about the setting sets its own.
    env.pop("DB_CONN_MAX_AGE", None)
    env["PYTHONPATH"] = str(ROOT)
    env["C_FORCE_ROOT"] = "1"
    # Celery's Django fixup runs Django's system checks at every start, which
    # imports every URL, view and admin module a worker never serves: a large
    # share of each start's CPU. The suite runs the checks itself
    # (`manage.py check` in tests/console/test_security.py and
    # tests/tickets/test_retention.py, and every `migrate`).
    env["CELERY_SKIP_CHECKS"] = "1"
    # The project's own modules compiled once, by the first process, not by
    # every one of the ~120 the suite starts (`make install` compiles the
    # libraries' bytecode: Makefile).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["RUNNER_PYTHON_ALLOWED_PREFIXES"] = ",".join(settings.RUNNER_PYTHON_ALLOWED_PREFIXES)
    env["RUNNER_COMMAND_ALLOWED"] = ",".join(settings.RUNNER_COMMAND_ALLOWED)
    env["RUNNER_USER"] = ""
    # One named secret the workers hold, for runners that reference it.
    env["RUNNER_SECRET_NAMES"] = "TEST_RUNNER_SECRET"
    env["TEST_RUNNER_SECRET"] = TEST_RUNNER_SECRET
    return env


class Processes:
    """Celery processes started for a test module; stopped (whole process
    groups) at teardown."""

    def __init__(self, tmp: Path, env: dict[str, str] | None = None):
        self.tmp = tmp
        # Overrides of the test environment (e.g. DATABASE_URL of a private
        # cluster, see tests/faults/cluster.py).
        self.env = env or {}
        self.procs: dict[str, subprocess.Popen] = {}
        # Where each log begins for the test at hand (a shared worker's log
        # holds the tests before it too).
        self.log_start: dict[str, int] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen:
        with open(self.tmp / f"{name}.log", "ab") as log:  # the child keeps its own copy
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "config", *args],
                cwd=ROOT,
                env={**_test_env(), **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def worker(
        self,
        name: str = "turns",
        queues: str = "turns,control",
        concurrency: int = 3,
        ready_timeout: float = 90.0,  # a loaded 2-core machine starts Python slowly
        embedded_beat: bool = False,
        max_tasks_per_child: int | None = None,
    ) -> subprocess.Popen:
        # embedded_beat: beat as a child the worker forks (celery worker -B)
        # rather than a process of its own that imports everything again.
        extra = ["-B", "-s", str(self.tmp / "beat-schedule")] if embedded_beat else []
        if max_tasks_per_child:  # each pool process exits after that many tasks
            extra += ["--max-tasks-per-child", str(max_tasks_per_child)]
        # A restart appends to the same log: only what this start writes counts.
        since = len(self.log(name))
        proc = self.start(
            name,
            "worker",
            "-Q",
            queues,
            "-c",
            str(concurrency),
            "-n",
            f"{name}@%h",
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "INFO",
            *extra,
        )
        wait_for(
            lambda: (
                b"ready." in self.log(name)[since:]
                and (not embedded_beat or b"beat: Starting" in self.log(name)[since:])
            ),
            timeout=ready_timeout,
            message=f"worker {name} to be ready",
        )
        return proc

    def beat(self, ready_timeout: float = 60.0) -> subprocess.Popen:
        since = len(self.log("beat"))
        proc = self.start(
            "beat", "beat", "--loglevel", "INFO", "-s", str(self.tmp / "beat-schedule")
        )
        # Under load beat takes seconds to start: a test that needs the sweeps
        # (a budget to be enforced) must not race it.
        wait_for(
            lambda: b"beat: Starting" in self.log("beat")[since:],
            timeout=ready_timeout,
            message="beat to start",
        )
        return proc

    def control_and_beat(self) -> subprocess.Popen:
        """The control worker (sweeps, one slot) with beat embedded: for tests
        that kill or stop the turns worker while the sweeps go on."""
        return self.worker("control", queues="control", concurrency=1, embedded_beat=True)

    def worker_and_beat(self) -> None:
        """The default worker with beat embedded (one process to start, not
        two: the processes tests start were over half the suite's CPU). A test that stops
        beat alone, or kills the worker while the sweeps must go on, starts
        them apart."""
        self.worker(embedded_beat=True)

    def log(self, name: str) -> bytes:
        """What process ``name`` logged during the test at hand."""
        path = self.tmp / f"{name}.log"
        try:
            with open(path, "rb") as f:
                # From the test's start on: a shared worker's log holds the
                # whole session, and waits read it at every poll.
                f.seek(self.log_start.get(name, 0))
                return f.read()
        except FileNotFoundError:
            return b""

    def alive(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def runs(self, name: str, *tasks: str) -> int:
        """How many runs of ``tasks`` process ``name`` has logged as done
        (Celery's INFO line "Task <name>[<id>] succeeded"): a test that
        checks something holds across sweeps counts them, not seconds."""
        log = self.log(name)
        return sum(
            len(re.findall(rb"Task " + re.escape(t.encode()) + rb"\[[^]]*\] succeeded", log))
            for t in tasks
        )

    def kill(self, name: str, sig=signal.SIGTERM, *, descendants: bool = False) -> None:
        """Signal ``name``'s process group and wait for it. ``descendants``:
        SIGKILL every descendant too, a command runner's process included
        (it has a session of its own, out of the group's reach)."""
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        family = _descendants(proc.pid) if descendants else []
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=8)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for child in family:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)

    def stop_all(self) -> None:
        """At teardown nothing is left to observe: every process the test
        started is killed with all its descendants, at once (a warm shutdown
        would wait for each worker's pool on every test that started one)."""
        for name in list(self.procs):
            self.kill(name, signal.SIGKILL, descendants=True)


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


# --- The waits' listener (tickets/waits.py) -----------------------------------------------


def waiting_on(key: str) -> bool:
    """Whether a wait on ticket ``key`` (or ``ANY``) in this process has subscribed."""
    from tickets import waits  # an app module: imported once the apps are loaded

    with waits._hub._lock:
        return bool(waits._hub._waiters.get(key))


def listener_wakeups(n: int) -> None:
    """Commit ``n`` notifications of tickets nobody waits on, one at a time,
    and wait until this process's listener has handed each on. A wait still
    waiting afterwards was woken by none of them: what a test of "it keeps
    waiting" observes, in place of sleeping a while."""
    import uuid

    from tickets import waits  # an app module: imported once the apps are loaded

    any_change = waits._hub.subscribe(waits.ANY)
    assert any_change is not None, "the listener is down"
    try:
        for _ in range(n):
            any_change.clear()
            with connection.cursor() as cur:
                cur.execute("SELECT pg_notify(%s, %s)", [waits.TICKET_CHANNEL, str(uuid.uuid4())])
            assert any_change.wait(10), "the listener did not hand on a notification"
    finally:
        waits._hub.unsubscribe(waits.ANY, any_change)


def purge_broker() -> None:
    import redis

    with redis.Redis.from_url(settings.CELERY_BROKER_URL) as client:
        client.flushdb()


def queued_tasks(queue: str) -> list[tuple[str, list]]:
    """The (task name, args) of every message waiting in a Redis queue."""
    import base64
    import json

    import redis

    with redis.Redis.from_url(settings.CELERY_BROKER_URL) as client:
        raw = client.lrange(queue, 0, -1)
    out = []
    for item in reversed(raw):  # kombu LPUSHes: the oldest is last
        message = json.loads(item)
        args = json.loads(base64.b64decode(message["body"]))[0]
        out.append((message["headers"]["task"], args))
    return out


def broker_queue_length(queue: str) -> int:
    import redis

    with redis.Redis.from_url(settings.CELERY_BROKER_URL) as client:
        return client.llen(queue)


# A test that starts processes of its own carries one of these (`make
# test-fast` leaves them out).
PROCESS_MARKERS = ("integration", "browser", "faults", "multihost")


def _starts_processes(request) -> None:
    if not any(request.node.get_closest_marker(m) for m in PROCESS_MARKERS):
        pytest.fail(
            f"{request.node.nodeid} starts Celery processes: mark it integration",
            pytrace=False,
        )


@pytest.fixture
def celery_procs(request, transactional_db, tmp_path):
    """Start-your-own real Celery processes against the test database: for a
    test that kills, restarts or configures them."""
    _starts_processes(request)
    purge_broker()
    procs = Processes(tmp_path)
    yield procs
    procs.stop_all()


class SharedWorker:
    """The ``worker`` fixture's worker: one per xdist worker, started by the
    first test that asks for it and kept for the next ones, so each of them
    does not pay a worker's start.

    Between those tests it must not act: every other test shares its
    database and expects no consumer, no dispatcher and no sweeps. So it has
    a Redis database of its own (the test process publishes there while a
    ``worker`` test runs), and after its test its whole process group is
    stopped (SIGSTOP) once none of its database sessions is inside a
    transaction or holds a sweep's advisory lock (a stopped one would hold
    its locks through the flush and the tests after it), and continued
    (SIGCONT) by the next test
    that asks for it. It is started again when the environment a test would
    give it differs (a test that set a variable for it), and killed after a
    test that failed or left work in the ledger (a turn running, a ticket not
    yet terminal): the next test then starts a fresh one."""

    NAME = "turns"

    def __init__(self, tmp: Path):
        self.procs = Processes(tmp)
        self.env: dict[str, str] | None = None
        self.stopped = False
        self.broker = _shared_broker_url()
        self.own_broker = ""

    def ready(self) -> Processes:
        self.own_broker = settings.CELERY_BROKER_URL
        _use_broker(self.broker)
        # What it would be started with (pytest names the test at hand in
        # PYTEST_CURRENT_TEST: no difference that matters to a worker).
        env = {k: v for k, v in _test_env().items() if k != "PYTEST_CURRENT_TEST"}
        if self.env != env or not self.procs.alive(self.NAME):
            self.kill()
            self.procs.worker_and_beat()
            self.env = env
        else:
            self._continue()
            # The flush after its last test emptied the registry: this worker
            # as it registered itself at start (runtime.worker._register).
            from runtime import registry

            registry.register_worker(
                name=f"{self.NAME}@{socket.gethostname()}",
                host=socket.gethostname(),
                pid=self.procs.procs[self.NAME].pid,
                queues=["control", "turns"],
                pool_size=3,
            )
        # Its log from here on is this test's.
        path = self.procs.tmp / f"{self.NAME}.log"
        self.procs.log_start[self.NAME] = path.stat().st_size if path.exists() else 0
        return self.procs

    def after(self, request) -> None:
        try:
            report = getattr(request.node, "rep_call", None)
            if report is None or report.failed or not _ledger_at_rest() or not self._stop():
                self.kill()
        finally:
            _use_broker(self.own_broker)

    def _stop(self) -> bool:
        """SIGSTOP the worker's process group at a moment when none of its
        database sessions is inside a transaction or holds an advisory lock
        (a sweep's: every other worker's sweeps would skip while it is
        stopped); False if none came."""
        group = self.procs.procs[self.NAME].pid

        def stopped_at_rest() -> bool:
            os.killpg(group, signal.SIGSTOP)
            # The signal is delivered as each process is next scheduled.
            wait_for(lambda: _group_stopped(group), timeout=5, message="the group to stop")
            if not _other_sessions(busy=True):
                return True
            os.killpg(group, signal.SIGCONT)
            return False

        try:
            wait_for(stopped_at_rest, timeout=10, interval=0.02, message="the worker at rest")
        except AssertionError:
            return False
        self.stopped = True
        return True

    def _continue(self) -> None:
        if self.stopped:
            os.killpg(self.procs.procs[self.NAME].pid, signal.SIGCONT)
            self.stopped = False

    def kill(self) -> bool:
        """Kill it (SIGKILL reaches a stopped process too); whether it ran."""
        ran = bool(self.procs.procs)
        self.procs.stop_all()
        self.env = None
        self.stopped = False
        return ran


def _group_stopped(group: int) -> bool:
    """Whether every process of process group ``group`` is stopped (or dead),
    from each process's /proc/<pid>/stat (one read each: a machine runs many)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # After the command's closing parenthesis: state, ppid, pgrp.
                state, _, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError):
            continue
        if int(pgrp) == group and state not in ("T", "Z", "X", "x"):
            return False
    return True


def _shared_broker_url() -> str:
    """A Redis database for the shared worker, 8 below this xdist worker's."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(settings.CELERY_BROKER_URL)
    own = (int(parts.path.strip("/") or 0) - 8) % 16
    return urlunsplit(parts._replace(path=f"/{own}"))


def _use_broker(url: str) -> None:
    """The broker this process publishes to and reads from, from now on."""
    from config.celery import app

    settings.CELERY_BROKER_URL = url
    app.conf.update(broker_url=url, broker_read_url=url, broker_write_url=url)
    # The app's connection and producer pools, taken again from kombu's
    # registry of pools by URL (which keeps each URL's pool open for the
    # next switch back).
    app._pool = None
    app.amqp._producer_pool = None


def _other_sessions(busy: bool = False) -> int:
    """How many sessions of the test database other than this one there are
    (``busy``: running a statement, inside a transaction, or holding an
    advisory lock, which the sweeps take for the session: runtime/turns/sweeplock.py)."""
    busy_only = (
        " AND (state IS DISTINCT FROM 'idle' OR pid IN"
        " (SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory'))"
    )
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            + (busy_only if busy else "")
        )
        return cur.fetchone()[0]


def _ledger_at_rest() -> bool:
    """No turn running and every ticket terminal or waiting: nothing a
    worker could still be writing while the flush empties the tables."""
    from tickets.models import TURN_ACTIVE_STATES, Ticket, TicketState, Turn

    busy = (TicketState.QUEUED, TicketState.RUNNING, TicketState.RECOVERING)
    return (
        not Turn.objects.filter(state__in=TURN_ACTIVE_STATES).exists()
        and not Ticket.objects.filter(state__in=busy).exists()
    )


@pytest.fixture(scope="session")
def _shared_worker(django_db_setup, tmp_path_factory, django_db_blocker):  # noqa: F811
    # After the test database exists, so it is killed before the database is dropped.
    shared = SharedWorker(tmp_path_factory.mktemp("shared-worker"))
    yield shared
    if shared.kill():
        # Its sessions end before pytest-django drops the test database.
        with django_db_blocker.unblock():
            wait_for(lambda: not _other_sessions(), timeout=20, message="its sessions to end")
            connection.close()
        import redis

        with redis.Redis.from_url(shared.broker) as client:  # its broker database left empty
            client.flushdb()


@pytest.fixture
def worker(request, transactional_db, _shared_worker):
    """A real worker (3 processes) on both queues, with beat embedded (0.5 s
    sweeps), shared by the tests of this xdist worker that need only "a
    worker" (``SharedWorker``); a test that kills, restarts or configures
    one starts its own (``celery_procs``)."""
    _starts_processes(request)
    procs = _shared_worker.ready()
    purge_broker()
    yield procs
    _shared_worker.after(request)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on its item (``rep_call``: did the test pass)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(autouse=True, scope="session")
def _close_ticket_wait_listener():
    """wait_s opens one LISTEN session per process (tickets/waits.py), and
    wake-ups one NOTIFY session (core/wakes.py): close them before
    pytest-django drops the test database."""
    yield
    from core import wakes
    from tickets import waits

    waits.stop_listener()
    wakes.close()
