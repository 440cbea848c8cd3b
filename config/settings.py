"""Settings, read from the environment in one place (see the README's table).

The embedded default needs no services: SQLite under ``var/`` and Celery's
filesystem transport under ``var/broker/``. Production and the test suite set
``DATABASE_URL`` (PostgreSQL) and ``CELERY_BROKER_URL`` (Redis).
"""

from __future__ import annotations

import base64
import secrets
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
VAR_DIR = Path(env.str("CLAIMCHECK_VAR_DIR", default=str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _generated_secret(name: str, make=lambda: secrets.token_urlsafe(48)) -> str:
    """A secret generated once into var/ and kept there (mode 0600)."""
    path = VAR_DIR / name
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(make())
    return path.read_text().strip()


SECRET_KEY = env.str("SECRET_KEY", default="") or _generated_secret("secret_key")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "console",
    "endpoints",
    "tickets",
    "recovery",
]

MIDDLEWARE = [
    "config.middleware.ApiErrorShapeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files from the app server itself (runserver without DEBUG, and
    # gunicorn): no separate web server needed for the console's CSS and htmx.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------
DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE: a writer takes the database lock at BEGIN, so writers
    # serialise and the row-lock rules of the runtime still hold on one host.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DB_CONN_MAX_AGE", default=60))
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # Prepared statements only where asked for (prepare=True): the admission
    # hot path. Django's own queries keep being planned per execution.
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 1_000_000_000
# Admission's one statement as a server-side prepared statement (PostgreSQL).
ADMISSION_PREPARED = env.bool("ADMISSION_PREPARED", default=True)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"  # `collectstatic` target for production
STATIC_ROOT.mkdir(exist_ok=True)
# Serve straight from static/ (no collectstatic step needed for `make run`).
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

# Artifacts: large content lives here, tickets keep a pointer.
STORAGES = {
    "default": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(VAR_DIR / "artifacts")},
    },
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# --- Ledger limits -----------------------------------------------------------
TICKET_MAX_INPUT_BYTES = env.int("TICKET_MAX_INPUT_BYTES", default=65536)
TICKET_MAX_RESULT_BYTES = env.int("TICKET_MAX_RESULT_BYTES", default=65536)
TRACE_SOFT_LIMIT = env.int("TRACE_SOFT_LIMIT", default=50)
TRACE_HARD_LIMIT = env.int("TRACE_HARD_LIMIT", default=200)
SWEEP_INTERVAL_S = env.float("SWEEP_INTERVAL_S", default=5.0)
# A queued ticket of a free endpoint older than this is re-dispatched by beat
# (its broker message was lost: broker flushed, publish failed after commit).
REDISPATCH_AFTER_S = env.float("REDISPATCH_AFTER_S", default=10.0)
# Longest wait_s an admission may ask for.
ADMISSION_MAX_WAIT_S = env.float("ADMISSION_MAX_WAIT_S", default=60.0)

DELIVERY_ALLOWED_HOSTS = env.list("DELIVERY_ALLOWED_HOSTS", default=[])
# Standard Webhooks keys are "whsec_" + standard base64 of the raw key bytes.
DELIVERY_SIGNING_SECRET = env.str("DELIVERY_SIGNING_SECRET", default="") or _generated_secret(
    "webhook_signing_secret",
    lambda: "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode(),
)
DELIVERY_BACKOFF_BASE_S = env.float("DELIVERY_BACKOFF_BASE_S", default=2.0)
DELIVERY_BACKOFF_CAP_S = env.float("DELIVERY_BACKOFF_CAP_S", default=600.0)
DELIVERY_MAX_ATTEMPTS = env.int("DELIVERY_MAX_ATTEMPTS", default=8)
DELIVERY_TIMEOUT_S = env.float("DELIVERY_TIMEOUT_S", default=10.0)
OBLIGATION_UPDATE_INTERVAL_S = env.int("OBLIGATION_UPDATE_INTERVAL_S", default=3600)

# --- Celery -------------------------------------------------------------------
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS: dict = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    # Name the (unused) host so kombu does not warn on every connection.
    if CELERY_BROKER_URL in ("filesystem://", "filesystem:///"):
        CELERY_BROKER_URL = "filesystem://localhost//"
    _broker = VAR_DIR / "broker"
    for _sub in ("in", "processed", "control"):
        (_broker / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker / "in"),
        "data_folder_out": str(_broker / "in"),
        "processed_folder": str(_broker / "processed"),
        # Exchange tables; kombu's default is ./control in the working directory.
        "control_folder": str(_broker / "control"),
        "store_processed": False,
    }
else:
    # The visibility timeout must exceed the longest turn budget; a redelivered
    # message then finds its ticket no longer queued and does nothing.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 6 * 3600}
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
    },
}
# Turns can occupy every worker process for their whole budget; sweeps and
# deliveries get their own queue so a full pool can never starve the sweeps
# that enforce budgets. `make run` starts a worker for each queue.
CELERY_TASK_DEFAULT_QUEUE = "turns"
CELERY_TASK_ROUTES = {
    "endpoints.sweep_*": {"queue": "control"},
    "tickets.sweep_*": {"queue": "control"},
    "tickets.deliver": {"queue": "control"},
}
