"""Fault tests behind PgBouncer, the topology docs/howto/deploy.md recommends: the
web and the turns workers connect through PgBouncer in transaction mode, the
control worker and beat directly, the LISTEN sessions directly
(``DATABASE_LISTEN_URL``).

PgBouncer 1.18 does not refuse a client while its server is away: it holds
the client's login or query until it can connect again, and after a failed
connect it tries again only ``server_login_retry`` later (15 s by default).
So after a crash the control worker (direct) reaches the database at once,
while the pooled processes wait up to ``server_login_retry`` more: the budget
sweep runs first. What must hold: a finished result the worker holds is the
ticket's result, no endpoint is quarantined for the pooler's delay, and a
committed admission's ``wait_s`` answers within its own time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from .cluster import free_port
from .figures import FULL
from .stack import Stack, figures, unfinished, wait_until
from .test_faults import assert_audit_clean, decide_finalize

pytestmark = [pytest.mark.faults, pytest.mark.integration]

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
# What the turns ask for: each runner returns during the outage, before its
# deadline; the deadline passes during the outage too, so the sweep, back
# first, interrupts every turn before its worker can finish it.
RUN_S = 4
BUDGET_S = 6
GRACE_S = 2
# The crash: long enough to outlast every turn's remaining budget. The full
# set takes the outside run's 30 s.
OUTAGE_S = 30 if FULL else 12
# A ``wait_s`` sent before the crash answers within its own time (and this
# margin for a loaded machine), never after the outage.
WAIT_S = 4
WAIT_MARGIN_S = 4


class Bouncer:
    """PgBouncer 1.18 in transaction mode in front of the fault cluster's
    database, on a port that stays the same across restarts."""

    def __init__(self, stack: Stack) -> None:
        if not os.path.exists(PGBOUNCER):
            pytest.skip("pgbouncer is not installed (`make pgbouncer`)")
        self.pg, self.db = stack.pg, stack.db
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="cc-faults-pgbouncer-"))
        self.logfile = self.dir / "pgbouncer.log"
        self.proc: subprocess.Popen | None = None
        self.login_retry = 0

    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.db}"

    def start(self, *, server_login_retry: int) -> Bouncer:
        self.login_retry = server_login_retry
        (self.dir / "users.txt").write_text('"postgres" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            f"""[databases]
{self.db} = host=127.0.0.1 port={self.pg.port} dbname={self.db}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir / "users.txt"}
pool_mode = transaction
default_pool_size = 20
max_client_conn = 400
ignore_startup_parameters = extra_float_digits
server_login_retry = {server_login_retry}
"""
        )
        # It refuses to run as root: it reads its files, then drops to nobody.
        user = ["-u", "nobody"] if os.geteuid() == 0 else []
        with open(self.logfile, "ab") as log:
            self.proc = subprocess.Popen(
                [PGBOUNCER, *user, str(self.dir / "pgbouncer.ini")],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

        def accepting() -> bool:
            assert self.proc.poll() is None, self.logfile.read_text()[-3000:]
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.5),
            ):
                return True
            return False

        wait_until(accepting, timeout=20, what="pgbouncer to listen")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self, *, server_login_retry: int) -> None:
        self.stop()
        self.start(server_login_retry=server_login_retry)

    def connect_failures(self) -> int:
        """How many times it failed to reach the server (it logs each)."""
        return self.logfile.read_bytes().count(b"closing because: connect failed")

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class PooledStack(Stack):
    """The fault stack with its web and turns workers behind ``bouncer``."""

    bouncer: Bouncer

    def env_for(self, name: str) -> dict[str, str]:
        if name != "web" and not name.startswith("turns"):
            return self.env  # control and beat connect directly, as the guide says
        return {
            **self.env,
            "DATABASE_URL": self.bouncer.url(),
            "DATABASE_LISTEN_URL": self.env["DATABASE_URL"],
            # PgBouncer 1.18 carries no protocol-level prepared statement.
            "DATABASE_PREPARED_CALLS": "0",
        }


@pytest.fixture(scope="module")
def stack(cluster, tmp_path_factory, django_db_blocker):
    s = PooledStack(cluster, tmp_path_factory.mktemp("pooled"), django_db_blocker)
    s.bouncer = Bouncer(s).start(server_login_retry=15)
    try:
        yield s.start(turns=(("turns", 2), ("turns-b", 2)), control=2)
    finally:
        s.teardown()
        s.bouncer.destroy()


def _returned(path: str, ids: list[str]) -> dict[str, float]:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return {r["ticket"]: r["returned_at"] for r in lines if r["ticket"] in ids}


# Default first: the reduced set (`make test`) runs the one today's defaults
# lose; the full set adds the recipe's (docs/howto/pgbouncer.md).
@pytest.mark.timeout(420)
@pytest.mark.parametrize("login_retry", [15, 1] if FULL else [15], ids=lambda r: f"retry{r}")
def test_postgres_crash_behind_pgbouncer_keeps_finished_results(stack, record_figures, login_retry):
    """Turns of 4 s on a 6 s budget (grace 2 s) through PgBouncer;
    PostgreSQL crashes (``-m immediate``) as they begin and stays down past
    every deadline, and comes back just after PgBouncer's last failed
    connect (so its ``server_login_retry`` runs in full after the recovery).
    The sweep (direct) interrupts the turns before their workers (pooled)
    can finish them. Every result that returned before its interrupt is
    recorded ``succeeded`` with its result, no endpoint is quarantined, a
    ``wait_s`` sent before the crash is answered 201 within its own time,
    nothing runs twice, the audit is clean."""
    from .runners import returned_file

    stack.bouncer.restart(server_login_retry=login_retry)
    endpoints = [f"pooled-r{login_retry}.ep-{i}" for i in range(2)]
    for address in endpoints:
        stack.create_endpoint(
            address,
            runner=stack.runner(path="tests.faults.runners.timed"),
            turn_budget_s=BUDGET_S,
            interrupt_grace_s=GRACE_S,
            heartbeat_timeout_s=60,
        )
    ids: list[str] = []
    for address in endpoints[1:]:
        resp = stack.http.post(
            "/api/v1/tickets", json={"endpoint": address, "input": {"seconds": RUN_S}}
        )
        assert resp.status_code == 201, resp.text
        ids.append(resp.json()["id"])
    # The first waits (wait_s) through the crash.
    waited: dict = {}

    def wait_through() -> None:
        t0 = time.monotonic()
        try:
            waited["resp"] = stack.http.post(
                "/api/v1/tickets",
                json={
                    "endpoint": endpoints[0],
                    "input": {"seconds": RUN_S},
                    "dedupe_key": f"waits-through-{login_retry}",
                    "wait_s": WAIT_S,
                },
                timeout=60,
            )
        except httpx.HTTPError as exc:
            waited["error"] = repr(exc)
        waited["s"] = time.monotonic() - t0

    waiter = threading.Thread(target=wait_through, daemon=True)
    waiter.start()

    def waiting_ticket() -> str | None:
        rows = stack.sql(
            "SELECT id::text FROM tickets_ticket WHERE dedupe_key = %s",
            [f"waits-through-{login_retry}"],
        )
        return rows[0][0] if rows else None

    ids.insert(0, wait_until(waiting_ticket, timeout=60, what="the waiting admission to commit"))
    # Each runner has begun (it counts itself first): it needs the database no more.
    wait_until(
        lambda: all(stack.executions()[i] for i in ids), timeout=60, what="every runner to run"
    )
    turns = [
        r[0]
        for r in stack.sql(
            "SELECT id::text FROM runtime_turn WHERE ticket_id = ANY(%s::uuid[])", [ids]
        )
    ]
    assert len(turns) == len(ids)
    # The cluster runs with synchronous_commit off: a crash may lose the last
    # commits (the turns' starts). A checkpoint makes them durable first.
    stack.pg.execute("CHECKPOINT", db=stack.db)
    crashed, crashed_at = time.monotonic(), time.time()
    stack.pg.stop("immediate")
    path = returned_file(str(stack.counter_file))
    recovered = 0.0
    try:
        wait_until(
            lambda: len(_returned(path, ids)) == len(ids),
            timeout=60,
            what="every runner to return during the outage",
        )
        wait_until(
            lambda: time.monotonic() - crashed >= OUTAGE_S,
            timeout=OUTAGE_S + 60,
            what=f"{OUTAGE_S}s of outage",
        )
        # Back just after PgBouncer's next failed connect: its pooled
        # clients then wait out the whole server_login_retry.
        failures = stack.bouncer.connect_failures()
        wait_until(
            lambda: stack.bouncer.connect_failures() > failures,
            timeout=login_retry + 60,
            what="pgbouncer to try the server again",
        )
    finally:
        stack.pg.start()
        recovered = time.monotonic()
    down_s = recovered - crashed
    waiter.join(timeout=120)
    states = stack.wait_terminal(set(ids), timeout=120)
    settled_s = time.monotonic() - recovered
    rows = stack.sql(
        "SELECT t.id::text, t.state, t.error->>'code',"
        " extract(epoch FROM tu.interrupt_requested_at), t.result IS NOT NULL, tu.state"
        " FROM tickets_ticket t JOIN runtime_turn tu ON tu.id = t.turn_id"
        " WHERE t.id = ANY(%s::uuid[])",
        [ids],
    )
    quarantined = stack.sql(
        "SELECT address, quarantine_case::text FROM endpoints_endpoint"
        " WHERE address = ANY(%s) AND state = 'quarantined'",
        [endpoints],
    )
    back = _returned(path, ids)
    interrupted = [r for r in rows if r[3] is not None]
    before = {r[0]: r for r in rows if r[3] is None or back[r[0]] < float(r[3])}
    report = stack.audit()
    record_figures(
        figures(
            f"postgres_crash_behind_pgbouncer_retry{login_retry}",
            stack,
            None,
            acknowledged=set(ids),
            audit=report,
            seconds_down=round(down_s, 1),
            settled_after_recovery_s=round(settled_s, 1),
            interrupted=len(interrupted),
            returned_before_interrupt=len(before),
            quarantined=len(quarantined),
            wait_s_answered_after_s=round(waited.get("s", -1), 2),
            wait_s_status=waited["resp"].status_code if "resp" in waited else waited.get("error"),
            outcomes=dict(Counter(f"{r[1]}:{r[2] or ''}" for r in rows)),
        )
    )
    try:
        assert not quarantined, f"endpoints quarantined for the pooler's delay: {quarantined}"
        assert not (problem := unfinished(set(ids), states)), problem
        # The construction: each runner returned during the outage.
        assert all(at > crashed_at for at in back.values()), (crashed_at, back)
        assert len(before) == len(ids), rows
        discarded = {i: (r[1], r[2]) for i, r in before.items() if r[1] != "succeeded" or not r[4]}
        assert not discarded, f"results returned before their interrupt, discarded: {discarded}"
        # A committed admission answers 201 within its own wait, not after the outage.
        assert "resp" in waited, waited
        assert waited["resp"].status_code == 201, waited["resp"].text
        assert waited["resp"].json()["id"] == ids[0]
        assert waited["s"] < WAIT_S + WAIT_MARGIN_S, waited
        assert stack.replays() == {}
        assert_audit_clean(stack)
    finally:
        # What a failure left quarantined is released for the next fault.
        for _, case in quarantined:
            with contextlib.suppress(AssertionError):
                decide_finalize(stack, case)
