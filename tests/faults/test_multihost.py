"""The multi-host shape on one machine (`make multihost`; docs/howto/deploy.md).

"Host A" and "host B" each run a web process (gunicorn) and a turns worker
with its own node name and its own PROMETHEUS_MULTIPROC_DIR; one control
worker and one beat serve both; all share one PostgreSQL and one Redis (the
fault suite's private ones, tests/faults/cluster.py). The test:

1. admits tickets through both webs, then the same keys again through the
   other web (every one a duplicate of the first), and races one key on both
   webs at once: one ticket per key;
2. waits for every turn to complete, and shows both hosts' workers ran turns;
3. SIGKILLs host B's worker while both hosts are mid-turn: exactly host B's
   running turns are quarantined (one case each), host A's finish, and no
   ticket runs twice;
4. reads /metrics on both webs: each host's counters, the same ledger gauges.

It prints one ``MULTIHOST-FIGURES`` line (and the fault suite's figures file
records it). Skipped unless MULTIHOST=1: it starts eight processes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from .cluster import free_port
from .stack import Stack, unfinished, wait_until
from .test_faults import GRACE_S, HEARTBEAT_TIMEOUT_S, assert_audit_clean, decide_finalize

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.integration,
    pytest.mark.skipif(os.environ.get("MULTIHOST") != "1", reason="`make multihost` runs it"),
]

HOSTS = ("a", "b")


class MultiHost(Stack):
    """Stack's processes, twice over for web and turns."""

    def __init__(self, cluster, tmp: Path, db_blocker) -> None:
        super().__init__(cluster, tmp, db_blocker)
        self.ports = {"a": self.port, "b": free_port()}
        self.metrics_dirs = {h: tmp / f"metrics-{h}" for h in HOSTS}
        for d in self.metrics_dirs.values():
            d.mkdir()
        self.env.update(LOG_FORMAT="json", METRICS_ALLOWED_IPS="127.0.0.1")
        self.webs = {h: httpx.Client(base_url=self.url(h), timeout=30) for h in HOSTS}

    def url(self, host: str) -> str:
        return f"http://127.0.0.1:{self.ports[host]}"

    def _spawn(self, name: str, argv: list[str]) -> None:
        host = name.rsplit("-", 1)[-1] if name[-2:] in ("-a", "-b") else "a"
        saved = self.env
        self.env = {**saved, "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dirs[host])}
        try:
            super()._spawn(name, argv)
        finally:
            self.env = saved

    def spawn_web_on(self, host: str) -> None:
        self._spawn(
            f"web-{host}",
            [
                sys.executable, "-m", "gunicorn", "config.wsgi:application",
                "-c", "deploy/gunicorn.conf.py",
                "-b", f"127.0.0.1:{self.ports[host]}", "-w", "2", "-k", "gthread",
                "--threads", "4", "--timeout", "60",
            ],
        )  # fmt: skip

    def ready(self, name: str) -> bool:
        if not name.startswith("web-"):
            return super().ready(name)
        if self.procs[name].poll() is not None:
            raise AssertionError(f"{name} exited:\n{self.log(name)[-4000:].decode()}")
        try:
            return self.webs[name[-1]].get("/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def _spawners(self):
        out = {f"web-{h}": (lambda h=h: self.spawn_web_on(h)) for h in HOSTS}
        for h in HOSTS:
            out[f"turns-{h}"] = lambda h=h: self.spawn_worker(f"turns-{h}", "turns", 2)
        out["control"] = lambda: self.spawn_worker("control", "control", 2)
        out["beat"] = self.spawn_beat
        return out

    def start_all(self) -> MultiHost:
        self.turns, self.control = [], 2
        spawners = self._spawners()
        for spawn in spawners.values():
            spawn()
        self.cluster.ready()
        for client in (self.http, *self.webs.values()):
            client.headers["Authorization"] = f"Bearer {self.cluster.staff_key}"
        self.wait_ready(*spawners)
        return self

    def teardown(self) -> None:
        for client in self.webs.values():
            client.close()
        super().teardown()

    def admit(self, host: str, endpoint: str, key: str, seconds: float) -> httpx.Response:
        return self.webs[host].post(
            "/api/v1/tickets",
            json={"endpoint": endpoint, "input": {"seconds": seconds}, "dedupe_key": key},
        )


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if series.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            total += float(value)
    return total


@pytest.fixture(scope="module")
def multihost(cluster, tmp_path_factory, django_db_blocker):
    s = MultiHost(cluster, tmp_path_factory.mktemp("multihost"), django_db_blocker)
    try:
        yield s.start_all()
    finally:
        s.teardown()


@pytest.mark.timeout(900)
def test_two_hosts_share_the_ledger_and_a_dead_host_quarantines_only_its_own_turns(
    multihost, record_figures
):
    mh = multihost
    t0 = time.monotonic()
    endpoints = [f"mh.ep-{i}" for i in range(6)]
    for address in endpoints:
        mh.create_endpoint(
            address, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, interrupt_grace_s=GRACE_S
        )

    # 1. Admissions through both webs; the same keys through the other web.
    first: dict[str, str] = {}
    statuses: Counter = Counter()
    for i in range(40):
        host = HOSTS[i % 2]
        resp = mh.admit(host, endpoints[i % len(endpoints)], f"mh-{i}", 0.1)
        statuses[f"first:{resp.status_code}"] += 1
        first[f"mh-{i}"] = resp.json()["id"]
    for i in range(40):
        host = HOSTS[(i + 1) % 2]
        resp = mh.admit(host, endpoints[i % len(endpoints)], f"mh-{i}", 0.1)
        statuses[f"again:{resp.status_code}"] += 1
        assert resp.json()["id"] == first[f"mh-{i}"], "a duplicate names the first ticket"
    # One key raced on both webs at once, ten times.
    raced: list[tuple[str, int, str]] = []

    def race(host: str, key: str) -> None:
        resp = mh.admit(host, endpoints[0], key, 0.1)
        raced.append((key, resp.status_code, resp.json()["id"]))

    for n in range(10):
        threads = [threading.Thread(target=race, args=(h, f"race-{n}")) for h in HOSTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    by_key: dict[str, set[str]] = {}
    for key, status, ticket in raced:
        by_key.setdefault(key, set()).add(ticket)
        statuses[f"race:{status}"] += 1
    assert all(len(ids) == 1 for ids in by_key.values()), by_key
    assert statuses["first:201"] == 40 and statuses["again:200"] == 40, statuses
    assert statuses["race:201"] == 10 and statuses["race:200"] == 10, statuses

    # 2. Every turn completes, on both hosts' workers.
    ids = set(first.values()) | {next(iter(v)) for v in by_key.values()}
    states = mh.wait_terminal(ids, timeout=120)
    assert not (problem := unfinished(ids, states)), problem
    assert set(states.values()) == {"succeeded"}, Counter(states.values())
    pids = {h: mh.pids(f"turns-{h}") for h in HOSTS}
    ran = dict(
        mh.sql(
            "SELECT (worker->>'pid')::int, count(*) FROM runtime_turn "
            "WHERE ticket_id = ANY(%s::uuid[]) GROUP BY 1",
            [list(ids)],
        )
    )
    turns_by_host = {h: sum(n for p, n in ran.items() if p in pids[h]) for h in HOSTS}
    assert all(turns_by_host.values()), f"both hosts should have run turns: {turns_by_host}"
    flows_s = round(time.monotonic() - t0, 1)

    # 3. Long turns on every endpoint; kill host B's worker while both hosts
    # are mid-turn.
    long_ids: set[str] = set()
    for i in range(12):
        resp = mh.admit(HOSTS[i % 2], endpoints[i % len(endpoints)], f"long-{i}", 3.0)
        assert resp.status_code == 201, resp.text
        long_ids.add(resp.json()["id"])

    def running_on(host: str) -> list[tuple[str, str, str]]:
        return mh.sql(
            "SELECT t.id::text, t.ticket_id::text, e.address FROM runtime_turn t "
            "JOIN endpoints_endpoint e ON e.id = t.endpoint_id "
            "WHERE t.state = 'running' AND (t.worker->>'pid')::int = ANY(%s) "
            "AND t.started_at < now() - interval '300 milliseconds'",
            [list(mh.pids(f"turns-{host}"))],
        )

    wait_until(
        lambda: running_on("a") and running_on("b"),
        timeout=60,
        what="both hosts to be in the middle of a turn",
    )
    b_pids = mh.pids("turns-b")
    (killed_at,) = mh.sql("SELECT now()")[0]
    sessions = mh.db_sessions("turns-b")
    mh.kill("turns-b", signal.SIGKILL)
    mh.sessions_ended(sessions, "turns-b's database sessions to end")
    b_turns = mh.sql(
        "SELECT t.id::text, t.ticket_id::text, e.address FROM runtime_turn t "
        "JOIN endpoints_endpoint e ON e.id = t.endpoint_id "
        "WHERE t.state IN ('running', 'interrupting') AND (t.worker->>'pid')::int = ANY(%s)",
        [list(b_pids)],
    )
    assert b_turns, "the kill should have caught host B mid-turn"
    a_running = running_on("a")

    def b_quarantined():
        cases = dict(
            mh.sql(
                "SELECT turn_id::text, id::text FROM recovery_recoverycase "
                "WHERE turn_id = ANY(%s::uuid[]) AND state = 'open'",
                [[t[0] for t in b_turns]],
            )
        )
        return cases if len(cases) == len(b_turns) else None

    cases = wait_until(b_quarantined, timeout=120, what="host B's turns to be quarantined")
    (opened,) = mh.sql(
        "SELECT max(opened_at) FROM recovery_recoverycase WHERE id = ANY(%s::uuid[])",
        [list(cases.values())],
    )[0]
    all_cases = mh.sql(
        "SELECT c.turn_id::text, (t.worker->>'pid')::int FROM recovery_recoverycase c "
        "JOIN runtime_turn t ON t.id = c.turn_id"
    )
    assert {turn for turn, _ in all_cases} == set(cases), "a case for a turn not on host B"
    assert all(pid in b_pids for _, pid in all_cases)
    quarantined = {
        a for (a,) in mh.sql("SELECT address FROM endpoints_endpoint WHERE state = 'quarantined'")
    }
    assert quarantined == {t[2] for t in b_turns}, (quarantined, b_turns)
    # Host A's turns that were running at the kill finish on host A.
    a_states = mh.states({t[1] for t in a_running})
    wait_until(
        lambda: all(s == "succeeded" for s in mh.states({t[1] for t in a_running}).values()),
        timeout=60,
        what="host A's turns to finish",
    )
    for case in cases.values():
        decide_finalize(mh, case)
    mh.respawn("turns-b")
    mh.wait_ready("turns-b")
    long_states = mh.wait_terminal(long_ids, timeout=120)
    assert not (problem := unfinished(long_ids, long_states)), problem
    b_tickets = {t[1] for t in b_turns}
    assert all(long_states[t] == "orphaned" for t in b_tickets & long_ids)
    assert all(s == "succeeded" for t, s in long_states.items() if t not in b_tickets)
    replays = mh.replays()
    assert replays == {}, f"tickets run twice: {replays}"
    audit = assert_audit_clean(mh)

    # 4. Metrics on both webs: each host's own counters, the same ledger gauges.
    scraped = {h: mh.webs[h].get("/metrics").text for h in HOSTS}
    per_host = {
        h: {
            "admitted": metric(scraped[h], "claimcheck_admissions_total", outcome="admitted"),
            "duplicate": metric(scraped[h], "claimcheck_admissions_total", outcome="duplicate"),
            "turns_succeeded": metric(scraped[h], "claimcheck_turns_total", outcome="succeeded"),
            "turns_started": metric(scraped[h], "claimcheck_turns_started_total"),
        }
        for h in HOSTS
    }
    assert all(v["admitted"] > 0 and v["turns_started"] > 0 for v in per_host.values()), per_host
    assert metric(scraped["a"], "claimcheck_open_cases") == metric(
        scraped["b"], "claimcheck_open_cases"
    )
    # JSON logs on every host, with the turn ids on the turn lines.
    sample = [
        json.loads(line)
        for line in mh.log("turns-a").decode(errors="replace").splitlines()
        if line.startswith("{") and '"turn_id"' in line
    ]
    assert sample and all("trace_id" in r and "seq" in r for r in sample)

    figures = {
        "fault": "multihost",
        "processes": sorted(mh._spawners()),
        "admissions": dict(sorted(statuses.items())),
        "tickets_first_phase": len(ids),
        "turns_by_host": turns_by_host,
        "flows_s": flows_s,
        "killed_host_b_running_turns": len(b_turns),
        "host_a_running_at_kill": len(a_running),
        "host_a_turns_at_kill_end_states": dict(Counter(a_states.values())),
        "cases": len(all_cases),
        "quarantined_endpoints": sorted(quarantined),
        "seconds_kill_to_quarantine": round((opened - killed_at).total_seconds(), 1),
        "long_turns": dict(Counter(long_states.values())),
        "replays": len(replays),
        "audit": "clean" if audit.get("ok") else audit.get("counts"),
        "metrics_per_host": per_host,
    }
    print("MULTIHOST-FIGURES " + json.dumps(figures, sort_keys=True))
    record_figures(figures)
