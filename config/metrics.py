"""Prometheus metrics: the scrape-time database gauges and /metrics (the
series themselves are core/metrics.py, incremented where the work happens:
``core/observe.py``). Under gunicorn and Celery's prefork pool each
process counts on its own, so with ``PROMETHEUS_MULTIPROC_DIR`` set (one
directory per host, emptied before the processes start) prometheus-client
writes every process's values to memory-mapped files there and a scrape
adds them up (``MultiProcessCollector``). That is what a Celery operator
expects of a prefork pool: a per-process HTTP exporter cannot work (which
child would answer?), Pushgateway is meant for batch jobs, and an
event-based exporter needs task events on the broker. Web hosts serve the
host's files on ``/metrics``; a worker-only host runs ``manage.py
serve_metrics`` (docs/howto/operations.md). Without the variable (``make test``,
a single process) the values live in the process.

Gauges of the ledger's state (queued tickets and busy slot per endpoint,
endpoints by state, open cases, open obligations, active turns) are read
from indexed aggregates at scrape time (``LedgerCollector``): they are the
database's truth, the same from every host.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging

from django.conf import settings
from django.http import Http404, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily

from core.metrics import multiprocess_dir

log = logging.getLogger(__name__)


class LedgerCollector:
    """Gauges read from the database at scrape time. Every query reads a
    small table or a partial index (``ticket_queued_idx``-style indexes on
    queued tickets and open obligations, the active-turn index), so a scrape
    costs the same at a million tickets as at ten."""

    def describe(self):
        return []

    def collect(self):
        from django.db.models import Count  # noqa: PLC0415

        from endpoints.models import Endpoint  # noqa: PLC0415
        from recovery.models import CaseState, RecoveryCase  # noqa: PLC0415
        from tickets.models import (  # noqa: PLC0415  # noqa: PLC0415
            TURN_ACTIVE_STATES,
            EndpointLock,
            ObligationState,
            Ticket,
            TicketState,
            Turn,
        )

        up = GaugeMetricFamily(
            "claimcheck_ledger_scrape_ok", "1 when the ledger gauges below could be read."
        )
        try:
            queued = GaugeMetricFamily(
                "claimcheck_queued_tickets", "Queued tickets per endpoint.", labels=["endpoint"]
            )
            for row in (
                Ticket.objects.filter(state=TicketState.QUEUED)
                .values("endpoint__address")
                .annotate(n=Count("id"))
            ):
                queued.add_metric([row["endpoint__address"]], row["n"])
            busy = GaugeMetricFamily(
                "claimcheck_busy_slots",
                "Busy slots per endpoint (an endpoint runs one turn at a time: 0 or 1).",
                labels=["endpoint"],
            )
            for address, holder in EndpointLock.objects.values_list(
                "endpoint__address", "holder_id"
            ):
                busy.add_metric([address], 0 if holder is None else 1)
            endpoints = GaugeMetricFamily(
                "claimcheck_endpoints", "Endpoints by state.", labels=["state"]
            )
            by_state = dict(Endpoint.objects.values_list("state").annotate(n=Count("id")))
            for state in ("available", "quarantined"):
                endpoints.add_metric([state], by_state.get(state, 0))
            quarantined = GaugeMetricFamily(
                "claimcheck_quarantined_endpoints", "Endpoints in quarantine."
            )
            quarantined.add_metric([], by_state.get("quarantined", 0))
            cases = GaugeMetricFamily("claimcheck_open_cases", "Open recovery cases.")
            cases.add_metric([], RecoveryCase.objects.filter(state=CaseState.OPEN).count())
            obligations = GaugeMetricFamily(
                "claimcheck_open_obligations", "Tickets whose obligation to the requester is open."
            )
            obligations.add_metric(
                [], Ticket.objects.filter(obligation_state=ObligationState.OPEN).count()
            )
            turns = GaugeMetricFamily(
                "claimcheck_active_turns", "Turns running or interrupting.", labels=["state"]
            )
            active = dict(
                Turn.objects.filter(state__in=TURN_ACTIVE_STATES)
                .values_list("state")
                .annotate(n=Count("id"))
            )
            for state in TURN_ACTIVE_STATES:
                turns.add_metric([str(state)], active.get(str(state), 0))
        except Exception as exc:  # the database is down: say so, keep the counters
            from core.transient import describe, drop_broken_connection  # noqa: PLC0415

            log.warning("ledger gauges unavailable: %s", describe(exc))
            drop_broken_connection()
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield from (up, queued, busy, endpoints, quarantined, cases, obligations, turns)


def host_registry(*, ledger: bool) -> CollectorRegistry:
    """This host's processes (the files in ``PROMETHEUS_MULTIPROC_DIR``)
    and, with ``ledger``, the database gauges, as one registry: what
    ``/metrics`` and ``serve_metrics`` expose."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    if ledger:
        registry.register(LedgerCollector())
    return registry


def render(*, ledger: bool = True) -> bytes:
    """The exposition text: this host's processes (or this process) and,
    with ``ledger``, the database gauges."""
    if multiprocess_dir():
        return generate_latest(host_registry(ledger=ledger))
    text = generate_latest(REGISTRY)
    if ledger:
        ledger_registry = CollectorRegistry()
        ledger_registry.register(LedgerCollector())
        text += generate_latest(ledger_registry)
    return text


def _client_allowed(addr: str) -> bool:
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    for entry in settings.METRICS_ALLOWED_IPS:
        try:
            if ip in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


def _token_ok(request) -> bool:
    token = settings.METRICS_BEARER_TOKEN
    if not token:
        return False
    given = request.headers.get("Authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


def allowed(request) -> bool:
    """A client address in ``METRICS_ALLOWED_IPS`` (addresses or networks;
    REMOTE_ADDR, the peer's address), or the ``METRICS_BEARER_TOKEN``."""
    return _client_allowed(request.META.get("REMOTE_ADDR", "")) or _token_ok(request)


def metrics_view(request):
    """``GET /metrics``. A client that is not allowed gets a 404: the route
    does not reveal that it exists."""
    if request.method not in ("GET", "HEAD") or not allowed(request):
        raise Http404("no such page")
    return HttpResponse(render(), content_type=CONTENT_TYPE_LATEST)
