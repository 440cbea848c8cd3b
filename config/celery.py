import os

from celery import Celery, signals

from core.sweeps import SWEEP_TASKS, sweep_intervals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("claimcheck")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def _beat_schedule(sender, **kwargs):
    sender.conf.beat_schedule = {
        f"sweep-{name.replace('_', '-')}": {"task": SWEEP_TASKS[name], "schedule": every}
        for name, every in sweep_intervals().items()
    }
    from django.conf import settings

    if settings.RETENTION_DAYS:  # tickets/retention.py; off by default
        sender.conf.beat_schedule["prune-ledger"] = {
            "task": "tickets.prune_ledger",
            "schedule": settings.RETENTION_INTERVAL_S,
        }


# --- No gossip, no mingle, whatever the command line says ----------------------------------------


@signals.worker_init.connect
def _without_gossip_and_mingle(sender=None, **kwargs):
    """Every worker runs as with ``--without-gossip --without-mingle``, so no
    command can forget them. Gossip (worker-to-worker events) and mingle
    (state sync at start-up) serve nothing here: the ledger is the state, and
    the workers' registry is in the database (runtime/registry.py). Gossip
    also took a turns worker down when Redis restarted: its consumer's
    restart closed the gossip channel on a connection that was gone
    (``Unrecoverable error: AttributeError("'NoneType' object has no
    attribute 'hostname'")``, celery/kombu#582), and the worker exited.

    ``worker_init`` comes after the WorkController stored its options and
    before it builds its bootsteps, which read these two from them (the
    consumer's Gossip and Mingle steps are then disabled, as the flags do)."""
    options = getattr(sender, "options", None)
    if isinstance(options, dict):
        options["without_gossip"] = True
        options["without_mingle"] = True


@signals.worker_init.connect
def _released_connection_is_a_connection_error(**kwargs):
    """The same kombu fault by another path (kombu 5.7, caught by the fault
    suite's Redis restart): a consumer whose broker connection broke while a
    message was unacknowledged releases the connection, and closing its
    channel then restores that message through a new connection pool built
    from the released connection's settings: ``AttributeError("'NoneType'
    object has no attribute 'hostname'")`` in ``Channel._connparams``, which
    the close does not expect, and the worker exits. Here that case raises
    the connection error it is: the close ignores it, and the message stays
    in Redis's unacknowledged set, reserved by no live worker, so the
    lost-dispatch sweep publishes its ticket again if it is still queued
    (a ticket run twice is a no-op: the ticket row decides)."""
    from kombu.transport import redis as kombu_redis
    from redis.exceptions import ConnectionError as RedisConnectionError

    connparams = kombu_redis.Channel._connparams
    if getattr(connparams, "released_is_an_error", False):
        return

    def _connparams(self, asynchronous=False):
        if self.connection.client is None:
            raise RedisConnectionError("the broker connection was released")
        return connparams(self, asynchronous=asynchronous)

    _connparams.released_is_an_error = True
    kombu_redis.Channel._connparams = _connparams


# --- Database connections in the worker ----------------------------------------------------------


@signals.worker_init.connect
@signals.beat_init.connect
def _no_connection_pool(**kwargs):
    """Django's connection pool (DATABASE_POOL_MAX) is the web's: a prefork
    child runs one task at a time, so a pool saves a worker nothing, and the
    pool's connections and its threads must not cross the fork of the pool
    processes. Celery processes keep one connection per thread, as before,
    for DB_CONN_MAX_AGE seconds (the main process has made none yet)."""
    from django.conf import settings

    drop_connection_pool(settings.DATABASES["default"], settings.DB_CONN_MAX_AGE)


def drop_connection_pool(db: dict, conn_max_age: int) -> None:
    if db.get("OPTIONS", {}).pop("pool", None) is not None:
        db["CONN_MAX_AGE"] = conn_max_age


@signals.task_prerun.connect
@signals.task_postrun.connect
def _database_connections(signal=None, task=None, **kwargs):
    """Between tasks, what Django does between requests: close a connection
    that failed or outlived CONN_MAX_AGE and arm the health check of the
    others (CONN_HEALTH_CHECKS); keep the rest. (With CELERY_DB_REUSE_MAX set,
    Celery's own fixup no longer closes them all around every task.)

    A turn skips the health check's round trip (a ``SELECT 1`` before its
    first statement, a visible share of a short turn): its start is retried
    on a broken connection (``start_with_retry`` drops it and tries again on
    a new one), so the check would only move that recovery earlier."""
    from django.db import close_old_connections, connection

    from core.dispatch import RUN_TICKET

    close_old_connections()
    if (
        signal is signals.task_prerun
        and getattr(task, "name", "") == RUN_TICKET
        and connection.connection is not None
    ):
        connection.health_check_done = True


# --- Logs and metrics in the worker (core/logs.py, config/metrics.py) -----------------------


@signals.setup_logging.connect
def _logging(**kwargs):
    """Django's LOGGING (LOG_FORMAT, LOG_LEVEL) in workers and beat too: a
    receiver here stops Celery from installing its own root handler."""
    import logging.config

    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)


@signals.task_prerun.connect
def _bind_task(task_id=None, task=None, args=None, **kwargs):
    from core import logs
    from core.dispatch import DELIVER, RUN_TICKET

    logs.clear()
    fields = {"task": getattr(task, "name", ""), "task_id": task_id}
    if args and task is not None and task.name == RUN_TICKET:
        # The message's ticket; the turn that starts binds the ticket it runs.
        fields["ticket_id"] = args[0]
    elif args and task is not None and task.name == DELIVER:
        fields["delivery_id"] = args[0]
    logs.bind(**fields)


@signals.task_postrun.connect
def _unbind_task(**kwargs):
    from core import logs

    logs.clear()


@signals.worker_process_shutdown.connect
def _process_gone(pid=None, **kwargs):
    # A prefork child's live gauges leave with it (PROMETHEUS_MULTIPROC_DIR);
    # its counters stay in the host's total.
    from core import metrics

    if metrics.multiprocess_dir() and pid:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
