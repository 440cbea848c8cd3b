"""The sweeps beat runs (config/celery.py schedules them; /readyz checks
that each ran within its periods: health/checks.py)."""

# Every sweep beat runs: the name it records its runs under (health.SweepRun,
# read by /readyz) -> its task.
SWEEP_TASKS = {
    "budgets": "runtime.sweep_budgets",
    "lost_dispatches": "runtime.sweep_lost_dispatches",
    "deliveries": "tickets.sweep_deliveries",
    "obligations": "tickets.sweep_obligations",
    # Schedules' due slots (tickets/schedules.py).
    "schedules": "tickets.sweep_schedules",
}


def sweep_intervals() -> dict[str, float]:
    """Each sweep's beat period in seconds, by the name in ``SWEEP_TASKS``."""
    from django.conf import settings

    every = settings.SWEEP_INTERVAL_S
    return {
        "budgets": every,
        "lost_dispatches": every,
        "deliveries": every,
        "obligations": settings.OBLIGATION_SWEEP_INTERVAL_S,
        "schedules": settings.SCHEDULE_TICK_S,
    }
