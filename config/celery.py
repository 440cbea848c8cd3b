import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("claimcheck")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def _beat_schedule(sender, **kwargs):
    from django.conf import settings

    every = settings.SWEEP_INTERVAL_S
    sender.conf.beat_schedule = {
        "sweep-budgets": {"task": "endpoints.sweep_budgets", "schedule": every},
        "sweep-lost-dispatches": {"task": "endpoints.sweep_lost_dispatches", "schedule": every},
        "sweep-deliveries": {"task": "tickets.sweep_deliveries", "schedule": every},
        "sweep-obligations": {"task": "tickets.sweep_obligations", "schedule": max(every, 30)},
    }
