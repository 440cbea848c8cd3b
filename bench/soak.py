"""`make soak`: mixed demo traffic on `make run` for N minutes, then the
figures (docs/reference/commands.md, "Soak").

It starts `make run`'s supervisor itself (scripts/run.py, on ``SOAK_PORT``,
default 8020, in a var/ of its own: ``var/soak/`` of this checkout, or
``SOAK_VAR_DIR``; so a `make run` of the same checkout may run meanwhile,
and the audit at the end sees the soak's tickets alone) and sends,
at about ``--per-minute`` tickets a minute: demo.echo (half of them with
``wait_s``), demo.sleep, demo.research (children to demo.echo), demo.fail,
demo.stubborn (an isolated turn stopped by the escalation), tickets to an
endpoint that requires approval, which it approves, and demo.agent's
documented flows: a delegation to demo.echo resumed by a child's callback,
and a tool call that needs an owner, approved (three in four) or denied
through ``/endpoints/demo.agent/approvals`` and resumed by the approval
ticket's turn. Twice (at a quarter and
at three quarters of the run) it fills every turns slot with demo.stuck
turns on two endpoints of its own, waits for their quarantine, decides the
cases as their owner and asks "stop the process" for both while every slot
is still busy. Halfway it stops `make run` (SIGINT, as Ctrl-C) and starts it
again; submissions in that window are retried with the same dedupe key.

At the end it waits for the ledger to drain, then prints the figures and
exits 1 unless: every process is alive (no restart line from the
supervisor), 0 tickets lost (every admitted ticket terminal), every stop
request resolved, and `audit_ledger` clean.

    .venv/bin/python bench/soak.py [--minutes 30] [--per-minute 34]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# bench/http.py would shadow the standard library's http package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import httpx  # noqa: E402
import psycopg  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Before core.embedded is read: every path of the soak's stack (its
# servers' sockets, the demo key, audit_ledger's database) follows it.
os.environ["CLAIMCHECK_VAR_DIR"] = str(
    Path(os.environ.get("SOAK_VAR_DIR") or ROOT / "var" / "soak").resolve()
)

from core import embedded  # noqa: E402

TERMINAL = {"succeeded", "failed", "cancelled", "orphaned"}
STUCK = ("soak.stuck.a", "soak.stuck.b")
APPROVE = "soak.approve"
AGENT = "demo.agent"
# Share of the traffic by kind (the stuck turns come on their own schedule).
MIX = {
    "echo": 34,
    "echo_wait": 18,
    "sleep": 10,
    "research": 8,
    "approve": 10,
    "fail": 5,
    "stubborn": 1,
    "agent_delegate": 4,
    "agent_approve": 4,
}


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} soak   | {message}", flush=True)


class Stack:
    """`make run`'s supervisor as a child of ours; its output to a log."""

    def __init__(self, port: int, logdir: Path) -> None:
        self.port = port
        self.logdir = logdir
        self.proc: subprocess.Popen | None = None
        self.runs = 0
        self.restart_lines: list[str] = []

    def start(self) -> float:
        self.runs += 1
        env = {
            k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")
        }
        env["PORT"] = str(self.port)
        self.log = self.logdir / f"soak-run-{self.runs}.log"
        out = open(self.log, "w")  # noqa: SIM115 - the child keeps it
        started = time.monotonic()
        self.proc = subprocess.Popen(
            ["python3", "scripts/run.py"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"make run exited ({self.proc.returncode}); see {self.log}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/login/", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"make run did not serve within 180 s; see {self.log}")

    def stop(self) -> float:
        assert self.proc is not None
        started = time.monotonic()
        os.kill(self.proc.pid, signal.SIGINT)
        self.proc.wait(timeout=60)
        self._collect()
        return time.monotonic() - started

    def _collect(self) -> None:
        for line in self.log.read_text(errors="replace").splitlines():
            if "| " in line and " exited with " in line and " run    |" in line:
                self.restart_lines.append(line)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Traffic:
    def __init__(self, base: str, key: str) -> None:
        self.base = base
        self.http = httpx.Client(
            base_url=f"{base}/api/v1",
            headers={"Authorization": f"Bearer {key}"},
            timeout=httpx.Timeout(60.0, connect=5.0),
        )
        self.lock = threading.Lock()
        self.tickets: dict[str, str] = {}  # id -> kind
        self.kinds: Counter = Counter()
        self.errors: Counter = Counter()
        self.retries = 0
        self.echo_wait_s: list[float] = []
        self.approved: set[str] = set()
        self.decided: Counter = Counter()  # the agent's tool calls: approved, denied
        self.stops: list[dict] = []

    def call(self, method: str, path: str, body: dict | None = None, patience: float = 180.0):
        """One API call, repeated (same body, so the same dedupe key) across a
        restart of `make run`: connection errors and 503 are retried."""
        deadline = time.monotonic() + patience
        while True:
            try:
                response = self.http.request(method, path, json=body)
                if response.status_code != 503:
                    return response
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{method} {path}: no answer for {patience:.0f} s")
            with self.lock:
                self.retries += 1
            time.sleep(1.0)

    def submit(self, kind: str, endpoint: str, input: dict, wait_s: float | None = None) -> dict:  # noqa: A002
        body = {"endpoint": endpoint, "input": input, "dedupe_key": f"soak-{uuid.uuid4()}"}
        if wait_s:
            body["wait_s"] = wait_s
        started = time.monotonic()
        response = self.call("POST", "/tickets", body)
        if response.status_code not in (200, 201):
            with self.lock:
                self.errors[f"{kind} {response.status_code}"] += 1
            return {}
        ticket = response.json()
        with self.lock:
            self.tickets[ticket["id"]] = kind
            self.kinds[kind] += 1
            if wait_s and kind == "echo_wait" and ticket["state"] == "succeeded":
                self.echo_wait_s.append(time.monotonic() - started)
        return ticket

    def one(self, kind: str) -> None:
        if kind == "echo":
            self.submit(kind, "demo.echo", {"n": random.random()})
        elif kind == "echo_wait":
            self.submit(kind, "demo.echo", {"n": random.random()}, wait_s=10)
        elif kind == "sleep":
            self.submit(kind, "demo.sleep", {"seconds": random.choice([0.5, 1, 2])})
        elif kind == "research":
            self.submit(kind, "demo.research", {"children": random.choice([2, 3])})
        elif kind == "fail":
            self.submit(kind, "demo.fail", {})
        elif kind == "stubborn":
            self.submit(kind, "demo.stubborn", {"seconds": 600})
        elif kind == "approve":
            ticket = self.submit(kind, APPROVE, {"n": random.random()})
            if ticket:
                threading.Thread(target=self.approve, args=(ticket["id"],), daemon=True).start()
        elif kind == "agent_delegate":
            words = random.sample(["alpha", "beta", "gamma", "delta"], random.choice([1, 2]))
            self.submit(kind, AGENT, {"prompt": "delegate " + ", ".join(words)})
        elif kind == "agent_approve":
            ticket = self.submit(kind, AGENT, {"prompt": f"send soak-{random.randrange(1000)}"})
            if ticket:
                threading.Thread(target=self.decide, args=(ticket["id"],), daemon=True).start()

    def decide(self, ticket_id: str) -> None:
        """An owner's decision on the agent's pending tool call, once the
        approvals list shows it: approve three in four, deny the rest."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            response = self.call("GET", f"/endpoints/{AGENT}/approvals")
            calls = (
                [c for c in response.json() if c["ticket"] == ticket_id]
                if (response.status_code == 200)
                else []
            )
            if calls:
                approve = random.random() < 0.75
                decided = self.call(
                    "POST",
                    f"/endpoints/{AGENT}/approvals/{ticket_id}/{calls[0]['call_id']}",
                    {"approve": approve, "reason": "soak: " + ("go" if approve else "not now")},
                )
                with self.lock:
                    if decided.status_code == 200:
                        self.decided["approved" if approve else "denied"] += 1
                    else:
                        self.errors[f"agent decision {decided.status_code}"] += 1
                return
            state = self.call("GET", f"/tickets/{ticket_id}")
            if state.status_code == 200 and state.json()["state"] in TERMINAL:
                with self.lock:
                    self.errors["agent call ended before a decision"] += 1
                return
            time.sleep(1)
        with self.lock:
            self.errors["agent call: no pending approval within 300 s"] += 1

    def approve(self, ticket_id: str) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            response = self.call("GET", f"/tickets/{ticket_id}")
            if response.status_code == 200:
                data = response.json()
                if data["delivery"]["state"] == "awaiting_approval":
                    if self.call("POST", f"/tickets/{ticket_id}/approve").status_code == 200:
                        with self.lock:
                            self.approved.add(ticket_id)
                    return
                if data["state"] in TERMINAL and data["delivery"]["state"] != "none":
                    return
            time.sleep(2)

    # --- "stop the process" with every turns slot busy ---------------------------
    def stuck_round(self, round_no: int) -> None:
        log(f"stop round {round_no}: demo.stuck turns on {', '.join(STUCK)}")
        ids = [self.submit("stuck", address, {"seconds": 300})["id"] for address in STUCK]
        cases: dict[str, str] = {}
        deadline = time.monotonic() + 180
        while len(cases) < len(STUCK) and time.monotonic() < deadline:
            for address in STUCK:
                response = self.call("GET", f"/endpoints/{address}")
                if response.status_code == 200 and response.json().get("open_case"):
                    cases[address] = response.json()["open_case"]
            time.sleep(1)
        if len(cases) < len(STUCK):
            self.errors["stuck: no quarantine within 180 s"] += 1
            log(f"stop round {round_no}: quarantine not seen for every stuck turn ({cases})")
        for case in cases.values():
            inspection = self.call("POST", f"/recovery/cases/{case}/inspections").json()["id"]
            decided = self.call(
                "POST",
                f"/recovery/cases/{case}/decisions",
                {"action": "finalize_orphan", "inspection": inspection, "rationale": "soak"},
            )
            if decided.status_code != 201:
                self.errors[f"decision {decided.status_code}"] += 1
        busy = self.busy_slots()
        for address, case in cases.items():
            asked = time.monotonic()
            response = self.call(
                "POST", f"/recovery/cases/{case}/stop-process", {"rationale": "soak: free it"}
            )
            if response.status_code != 201:
                self.errors[f"stop-process {response.status_code}"] += 1
                log(f"stop-process for {address}: {response.status_code} {response.text[:200]}")
                continue
            stop = response.json()
            with self.lock:
                self.stops.append(
                    {"id": stop["id"], "asked": asked, "busy_slots": busy, "round": round_no}
                )
        log(f"stop round {round_no}: {len(cases)} stop(s) asked with {busy} turns slot(s) busy")
        del ids

    def busy_slots(self) -> str:
        response = self.call("GET", "/workers")
        if response.status_code != 200:
            return "?"
        busy = total = 0
        for worker in response.json()["workers"]:
            if "turns" in worker["queues"] and worker["status"] == "alive":
                total += worker["pool_size"]
                busy += sum(1 for slot in worker["slots"] if slot["status"] != "idle")
        return f"{busy}/{total}"


def ledger(sql: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(embedded.database_url(embedded.SUPERUSER)) as conn:
        return conn.execute(sql, params).fetchall()


def ensure_endpoints(traffic: Traffic) -> None:
    for address in STUCK:
        traffic.call(
            "POST",
            "/endpoints",
            {
                "address": address,
                "runner": {"kind": "python", "path": "runtime.demo.stuck", "isolation": "inline"},
                "owners": ["demo"],
                "turn_budget_s": 20,
                "interrupt_grace_s": 5,
            },
        )
    traffic.call(
        "POST",
        "/endpoints",
        {
            "address": APPROVE,
            "runner": {"kind": "python", "path": "runtime.demo.echo"},
            "owners": ["demo"],
            "requires_approval": True,
        },
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", 30)))
    parser.add_argument("--per-minute", type=float, default=34.0)
    parser.add_argument("--port", type=int, default=int(os.environ.get("SOAK_PORT", 8020)))
    args = parser.parse_args()
    var = embedded.var_dir()
    (var / "log").mkdir(parents=True, exist_ok=True)
    stack = Stack(args.port, var / "log")
    first_start = stack.start()
    log(f"make run up in {first_start:.1f} s (log {stack.log})")
    key = (var / "demo_api_key").read_text().strip()
    traffic = Traffic(f"http://127.0.0.1:{args.port}", key)
    ensure_endpoints(traffic)
    since = ledger("SELECT now()")[0][0]
    duration = args.minutes * 60
    started = time.monotonic()
    restart = {"at": duration / 2, "done": False, "down_s": 0.0, "stop_s": 0.0}
    rounds = {1: duration / 4, 2: duration * 3 / 4}
    kinds = list(MIX)
    weights = [MIX[k] for k in kinds]
    pool = ThreadPoolExecutor(max_workers=12)
    futures = []
    interval = 60.0 / args.per_minute
    next_at = time.monotonic()
    try:
        while (elapsed := time.monotonic() - started) < duration:
            if not restart["done"] and elapsed >= restart["at"]:
                restart["done"] = True
                log("restarting make run (SIGINT, as Ctrl-C)")
                down = time.monotonic()
                restart["stop_s"] = stack.stop()
                up = stack.start()
                restart["down_s"] = time.monotonic() - down
                log(
                    f"make run stopped in {restart['stop_s']:.1f} s, up again in {up:.1f} s "
                    f"(down {restart['down_s']:.1f} s)"
                )
            for n, at in list(rounds.items()):
                if elapsed >= at:
                    del rounds[n]
                    futures.append(pool.submit(traffic.stuck_round, n))
            futures.append(pool.submit(traffic.one, random.choices(kinds, weights)[0]))
            next_at += random.expovariate(1.0 / interval)
            time.sleep(max(0.0, next_at - time.monotonic()))
            if len(traffic.tickets) and len(traffic.tickets) % 100 == 0:
                log(f"{len(traffic.tickets)} tickets, {int(elapsed)} s")
        log("traffic done; draining")
        for future in futures:
            future.result()
        drained = drain(traffic)
        figures = report(traffic, stack, restart, since, drained, time.monotonic() - started)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        if stack.alive():
            stack.stop()
    print(json.dumps(figures["summary"], indent=2))
    return 0 if figures["ok"] else 1


def drain(traffic: Traffic, within: float = 420.0) -> float:
    """Wait until every ticket is terminal (stuck ones were finalized; a
    stubborn one takes its budget, grace and kill), at most ``within``."""
    started = time.monotonic()
    ids = list(traffic.tickets)
    while time.monotonic() - started < within:
        open_ = ledger(
            "SELECT count(*) FROM tickets_ticket WHERE id = ANY(%s::uuid[]) "
            "AND state NOT IN ('succeeded','failed','cancelled','orphaned')",
            (ids,),
        )[0][0]
        stops = ledger("SELECT count(*) FROM recovery_processstop WHERE outcome = 'requested'")[0][
            0
        ]
        if not open_ and not stops:
            break
        time.sleep(2)
    return time.monotonic() - started


def report(traffic, stack, restart, since, drained, took) -> dict:
    ids = list(traffic.tickets)
    states = dict(
        ledger(
            "SELECT state, count(*) FROM tickets_ticket WHERE id = ANY(%s::uuid[]) GROUP BY state",
            (ids,),
        )
    )
    everything = dict(
        ledger(
            "SELECT state, count(*) FROM tickets_ticket WHERE created_at >= %s GROUP BY state",
            (since,),
        )
    )
    lost = sum(n for state, n in states.items() if state not in TERMINAL)
    stops = ledger(
        "SELECT id::text, outcome, extract(epoch FROM done_at - created_at) "
        "FROM recovery_processstop WHERE created_at >= %s ORDER BY created_at",
        (since,),
    )
    unresolved = [s for s in stops if s[1] == "requested"]
    audit = subprocess.run(
        [str(ROOT / ".venv/bin/python"), "manage.py", "audit_ledger", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)},
    )
    try:
        audit_report = json.loads(audit.stdout)
    except json.JSONDecodeError:
        audit_report = {"raw": audit.stdout[-2000:] + audit.stderr[-2000:]}
    waits = sorted(traffic.echo_wait_s)
    stack._collect() if stack.alive() else None
    by_kind: dict[str, Counter] = defaultdict(Counter)
    rows = ledger("SELECT id::text, state FROM tickets_ticket WHERE id = ANY(%s::uuid[])", (ids,))
    for ticket_id, state in rows:
        by_kind[traffic.tickets[ticket_id]][state] += 1
    summary = {
        "minutes": round(took / 60, 1),
        "tickets_submitted": len(ids),
        "tickets_in_ledger_since_start": sum(everything.values()),
        "states_of_submitted": states,
        "states_by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "states_all_since_start (children and callbacks too)": everything,
        "lost (admitted, not terminal after drain)": lost,
        "drain_s": round(drained, 1),
        "echo_wait_s": {
            "n": len(waits),
            "p50": round(statistics.median(waits), 3) if waits else None,
            "p95": round(waits[int(len(waits) * 0.95) - 1], 3) if len(waits) >= 20 else None,
            "max": round(waits[-1], 3) if waits else None,
        },
        "approved": len(traffic.approved),
        "agent_tool_calls_decided": dict(traffic.decided),
        # Which turns completed the waiting tickets (demo.research's and
        # demo.agent's): an approval ticket's or a child's callback's
        # (docs/explanation/design.md, "Who completes a waiting ticket"); the audit
        # below checks each.
        "waiting_tickets_completed_by": dict(
            ledger(
                "SELECT CASE WHEN x.callback_for_id IS NULL THEN 'approval' ELSE 'callback' END,"
                " count(*) FROM tickets_ticket t JOIN runtime_turn u"
                " ON u.id = t.completed_by_turn_id JOIN tickets_ticket x ON x.id = u.ticket_id"
                " WHERE t.id = ANY(%s::uuid[]) GROUP BY 1",
                (ids,),
            )
        ),
        "client_retries (restart window, 503)": traffic.retries,
        "errors": dict(traffic.errors),
        "restart": {k: round(v, 1) if isinstance(v, float) else v for k, v in restart.items()},
        "supervisor_restart_lines": stack.restart_lines,
        "stop_requests": [
            {"outcome": s[1], "resolved_after_s": round(float(s[2]), 1) if s[2] else None}
            for s in stops
        ],
        "stop_requests_with_busy_slots": [s["busy_slots"] for s in traffic.stops],
        "stop_requests_unresolved": len(unresolved),
        "audit_ledger_exit": audit.returncode,
        "audit_violations": audit_report.get("violations", audit_report),
        "every_process_alive": stack.alive() and not stack.restart_lines,
    }
    ok = summary["every_process_alive"] and lost == 0 and not unresolved and audit.returncode == 0
    summary["ok"] = ok
    return {"summary": summary, "ok": ok}


if __name__ == "__main__":
    sys.exit(main())
