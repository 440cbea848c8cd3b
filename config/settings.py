"""Settings, read from the environment in one place (docs/reference/settings.md).

With no ``DATABASE_URL`` / ``CELERY_BROKER_URL``, the embedded default:
the PostgreSQL cluster and Redis server that `make run` starts under
``var/``, on the unix sockets core/embedded.py names. Production and the
test suite set both to their servers.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from datetime import timedelta
from pathlib import Path

import environ

from core import embedded
from core.logs import logging_config as logs_config

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
VAR_DIR = embedded.var_dir()
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
    "config.admin_apps.ClaimcheckAdminConfig",  # django.contrib.admin, its site ours
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "config.apps.ClaimcheckConfig",
    # Swagger UI's JS and CSS from ninja's own static files (not a CDN).
    "ninja",
    "axes",
    "accounts",
    "console",
    "endpoints",
    "runtime",
    "tickets",
    "recovery",
    "health",
]

MIDDLEWARE = [
    # First: the request id and incoming trace are bound for every log line,
    # and echoed on every response (core/logs.py).
    "core.tracing.RequestContextMiddleware",
    "core.middleware.ApiErrorShapeMiddleware",
    # Before sessions and keys are looked up: a NUL in a cookie or a key
    # would otherwise reach PostgreSQL (and answer 500).
    "core.middleware.InputGuardMiddleware",
    "core.middleware.TransientFaultMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files from the app server itself (runserver without DEBUG, and
    # gunicorn): no separate web server needed for the console's CSS and htmx.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Once the user is known: a console user's requests in flight are
    # counted, and every request's lease is released when it answers.
    "core.fairshare.FairShareMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last: turns a locked-out login into the lockout page (429).
    "axes.middleware.AxesMiddleware",
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
                "console.context_processors.theme",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------
DB_CONN_MAX_AGE = env.int("DB_CONN_MAX_AGE", default=60)
DATABASE_POOL_MAX = env.int("DATABASE_POOL_MAX", default=0)
# No DATABASE_URL: the embedded cluster, as the application role; `migrate`
# then connects as its owner role (DATABASE_MIGRATE_URL below).
_EMBEDDED_DB = not env.str("DATABASE_URL", default="")
DATABASES = {
    "default": embedded.unquote_host(
        env.db_url_config(
            env.str("DATABASE_URL", default="") or embedded.database_url(embedded.APP_ROLE, VAR_DIR)
        )
    ),
}
DATABASES["default"].setdefault("CONN_MAX_AGE", DB_CONN_MAX_AGE)
# A kept connection is checked before a request's first query; the check
# reads its socket and asks the server (SELECT 1) only when something is
# waiting there or it is not idle: no round trip on a healthy connection
# (core/postgresql/base.py).
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"]["ENGINE"] = "core.postgresql"
# Django's own psycopg pool, for a web tier without PgBouncer: a gthread
# process's threads share DATABASE_POOL_MAX connections instead of
# holding one each, and a thread that finds none free waits up to
# DATABASE_POOL_TIMEOUT_S (then 503 unavailable). Persistent
# connections and a pool exclude each other (Django refuses both).
# Celery processes drop it (config/celery.py): a prefork child runs one
# task at a time, and a pool's connections must not cross a fork.
if DATABASE_POOL_MAX:
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": min(env.int("DATABASE_POOL_MIN", default=1), DATABASE_POOL_MAX),
        "max_size": DATABASE_POOL_MAX,
        "timeout": env.float("DATABASE_POOL_TIMEOUT_S", default=5.0),
    }
# No automatic prepared statements (PgBouncer in transaction mode before 1.21
# keeps none): psycopg never reaches this threshold. The transition
# functions' calls bind their parameters on the server as unnamed
# statements (core/sqlfunctions.call_cursor), or, with
# DATABASE_PREPARED_CALLS, as named prepared statements planned once per
# server session, without planning each call. Only where a client
# connection keeps its server session (a direct connection, Django's pool,
# PgBouncer in session mode) or the pooler tracks prepared statements
# (PgBouncer 1.21+ with max_prepared_statements): docs/howto/deploy.md. On by
# default for the embedded cluster, which is always direct.
DATABASE_PREPARED_CALLS = env.bool("DATABASE_PREPARED_CALLS", default=_EMBEDDED_DB)
DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 1_000_000_000
# A database host that does not answer fails the connect in seconds (a
# 503 with Retry-After, a worker retry) instead of the OS's minutes.
DATABASES["default"]["OPTIONS"].setdefault(
    "connect_timeout", env.int("DB_CONNECT_TIMEOUT_S", default=5)
)
# The sessions that LISTEN (the web's ticket waits, tickets/waits.py; the
# workers' dispatcher, runtime/dispatcher.py) must hold one server session
# for their whole life: a notification reaches only the session that
# listened. Behind PgBouncer in transaction mode point this at PostgreSQL
# directly or at a session-mode pool (docs/howto/deploy.md). Empty: DATABASE_URL.
DATABASE_LISTEN_URL = env.str("DATABASE_LISTEN_URL", default="")
# Two roles (docs/howto/production.md): `migrate` connects with
# DATABASE_MIGRATE_URL (the owner role) when set; after every migrate the
# application role is granted what web and workers need, and no more. It is
# DATABASE_URL's user when the two URLs name different users.
DATABASE_MIGRATE_URL = env.str("DATABASE_MIGRATE_URL", default="") or (
    embedded.database_url(embedded.OWNER_ROLE, VAR_DIR) if _EMBEDDED_DB else ""
)
_migrate_user = env.db_url_config(DATABASE_MIGRATE_URL).get("USER") if DATABASE_MIGRATE_URL else ""
_app_user = DATABASES["default"].get("USER") or ""
DATABASE_APP_ROLE = env.str("DATABASE_APP_ROLE", default="") or (
    _app_user if _migrate_user and _migrate_user != _app_user else ""
)
# A worker process that finishes a turn with more tickets queued on the
# endpoint starts the next one itself (no broker round trip), for at most
# this many turns and this many seconds from its first start; then it
# publishes the next ticket for any free process (runtime.turns.run_ticket).
# TURN_CHAIN_MAX=1: every ticket goes through the broker.
TURN_CHAIN_MAX = max(1, env.int("TURN_CHAIN_MAX", default=20))
TURN_CHAIN_WINDOW_S = env.float("TURN_CHAIN_WINDOW_S", default=1.0)
# A process-isolated turn runs in its worker slot's warm process, which is
# replaced after this many turns (and after any interrupt, kill or a turn
# that changed its environment): runtime/isolation.py. 1: a fresh process
# for every turn (still forked ahead, after the previous task).
ISOLATION_RECYCLE_TURNS = max(1, env.int("ISOLATION_RECYCLE_TURNS", default=500))
# API keys verified in this process are remembered this many seconds (0: off),
# at most API_KEY_CACHE_SIZE of them (accounts/keys.py): a revocation or a
# user's deactivation made elsewhere takes effect here within this delay.
API_KEY_CACHE_S = env.float("API_KEY_CACHE_S", default=10.0)
API_KEY_CACHE_SIZE = env.int("API_KEY_CACHE_SIZE", default=1024)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTHENTICATION_BACKENDS = [
    # First: refuses a login from a locked-out username or address before the
    # password is even checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
# Datetimes shown without an explicit format (the admin's) read as the
# console prints them: 2026-12-02 07:27:22Z (config/formats/en/formats.py).
FORMAT_MODULE_PATH = "config.formats"

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

# --- HTTPS and cookies (production switches, Django's own names) -------------------------
# Off by default so `make run` works over plain http on localhost; a
# production deployment behind TLS turns them on (docs/howto/production.md).
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
SECURE_REDIRECT_EXEMPT = env.list("SECURE_REDIRECT_EXEMPT", default=[])
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=False)
SESSION_COOKIE_HTTPONLY = env.bool("SESSION_COOKIE_HTTPONLY", default=True)
SESSION_COOKIE_SAMESITE = env.str("SESSION_COOKIE_SAMESITE", default="Lax")
CSRF_COOKIE_SAMESITE = env.str("CSRF_COOKIE_SAMESITE", default="Lax")
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])


def _proxy_ssl_header(value: str) -> tuple[str, str] | None:
    """``HEADER=value``, e.g. ``HTTP_X_FORWARDED_PROTO=https``: the header a
    trusted TLS-terminating proxy sets (and strips from clients). Empty: none."""
    if not value:
        return None
    header, sep, expected = value.partition("=")
    if not sep or not header.startswith("HTTP_") or not expected:
        raise ValueError("SECURE_PROXY_SSL_HEADER must look like HTTP_X_FORWARDED_PROTO=https")
    return header, expected


SECURE_PROXY_SSL_HEADER = _proxy_ssl_header(env.str("SECURE_PROXY_SSL_HEADER", default=""))
# Django's defaults, stated: nosniff, a same-origin referrer, no framing.
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

# Content-Security-Policy (django-csp) on every response: scripts and styles
# only from our own static files, so an injected <script>, inline handler or
# <style> does not run. The templates carry no inline script or style, and
# htmx's injected indicator <style> is switched off (htmx-config in
# base.html; the indicator rules live in console.css).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        # Swagger UI draws its icons from data: URIs.
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

# --- Login throttling (django-axes, counted in the database: shared by every process) -------
# A username with LOGIN_FAILURE_LIMIT failed log-ins in a row from one client
# address is locked out, from that address only, for LOGIN_LOCKOUT_S (each
# failure during the lockout starts it again); a successful log-in resets the
# count. The pair, not either alone: counted per username, anyone could lock
# an owner out by typing wrong passwords for them; counted per address, one
# user behind a shared NAT or proxy locks out everyone behind it.
# `manage.py axes_reset_ip_username ADDRESS USERNAME` lifts one lockout.
AXES_FAILURE_LIMIT = env.int("LOGIN_FAILURE_LIMIT", default=10)
AXES_COOLOFF_TIME = timedelta(seconds=env.int("LOGIN_LOCKOUT_S", default=900))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_CLIENT_IP_CALLABLE = "console.throttle.client_ip"
# Proxies in front of the app that append to X-Forwarded-For (0: none; the
# client address is REMOTE_ADDR). Behind one proxy: 1.
LOGIN_PROXY_COUNT = env.int("LOGIN_PROXY_COUNT", default=0)
AXES_VERBOSE = False

# --- Ledger limits -----------------------------------------------------------
TICKET_MAX_INPUT_BYTES = env.int("TICKET_MAX_INPUT_BYTES", default=65536)
TICKET_MAX_RESULT_BYTES = env.int("TICKET_MAX_RESULT_BYTES", default=65536)
# How deep any JSON value that enters may nest (core/inputs.py): a request
# body's fields, a runner's reply, an agent's output. The worker itself
# fails to carry a value somewhere past 400 levels (pickling it to a turn's
# process, dataclasses.asdict, json): the cap keeps that out of reach.
TICKET_MAX_JSON_DEPTH = env.int("TICKET_MAX_JSON_DEPTH", default=64)
if not 1 <= TICKET_MAX_JSON_DEPTH <= 128:
    raise ValueError("TICKET_MAX_JSON_DEPTH must be between 1 and 128")
TRACE_SOFT_LIMIT = env.int("TRACE_SOFT_LIMIT", default=50)
TRACE_HARD_LIMIT = env.int("TRACE_HARD_LIMIT", default=200)
# Trace budgets (tickets/budgets.py, docs/howto/trace-budgets.md): the share of a hard
# limit past which the trace records one warning, and each model's price in
# currency units per million tokens, ``{"<model>": {"input": x, "output": y}}``
# (a model not listed counts its tokens, not its cost).
TRACE_BUDGET_SOFT_RATIO = env.float("TRACE_BUDGET_SOFT_RATIO", default=0.8)
if not 0 < TRACE_BUDGET_SOFT_RATIO <= 1:
    raise ValueError("TRACE_BUDGET_SOFT_RATIO must be in (0, 1]")
MODEL_PRICES = json.loads(env.str("MODEL_PRICES", default="{}"))
if not isinstance(MODEL_PRICES, dict) or not all(
    isinstance(p, dict) and all(isinstance(v, int | float) and v >= 0 for v in p.values())
    for p in MODEL_PRICES.values()
):
    raise ValueError('MODEL_PRICES must be {"<model>": {"input": n, "output": n}}')
SWEEP_INTERVAL_S = env.float("SWEEP_INTERVAL_S", default=5.0)
# Worker registry (GET /api/v1/workers, /workers): how often a worker says it
# is alive, and after how long without that it is shown as lost.
WORKER_HEARTBEAT_S = env.float("WORKER_HEARTBEAT_S", default=5.0)
WORKER_LOST_AFTER_S = env.float("WORKER_LOST_AFTER_S", default=30.0)
# An owner's "stop the process" that no worker has reported on after this
# long is closed as unreachable by the budget sweep (recovery.services).
PROCESS_STOP_TIMEOUT_S = env.float("PROCESS_STOP_TIMEOUT_S", default=60.0)
# A queued ticket of a free endpoint older than this is re-dispatched by beat
# (its broker message was lost: broker flushed, publish failed after commit).
REDISPATCH_AFTER_S = env.float("REDISPATCH_AFTER_S", default=10.0)
# The dispatcher (runtime/dispatcher.py; a thread of every worker that
# consumes the control queue) publishes the turns admission marked as owed.
# A NOTIFY wakes it; it also looks every DISPATCHER_POLL_S seconds, for a
# notification lost while its LISTEN connection was down.
DISPATCHER_ENABLED = env.bool("DISPATCHER_ENABLED", default=True)
DISPATCHER_POLL_S = env.float("DISPATCHER_POLL_S", default=1.0)
# The least time between the starts of two passes: a burst of admissions,
# each notifying, costs a pass per gap, not a pass each.
DISPATCHER_MIN_GAP_S = max(0.0, env.float("DISPATCHER_MIN_GAP_S", default=0.005))
DISPATCHER_BATCH = env.int("DISPATCHER_BATCH", default=500)
# Largest request body the API reads (413 too_large above it, before the
# body is read). Well above the ledger's own caps, which admission and the
# turn API enforce on the parsed content with their own 413.
API_MAX_BODY_BYTES = env.int(
    "API_MAX_BODY_BYTES",
    default=max(1024 * 1024, 4 * max(TICKET_MAX_INPUT_BYTES, TICKET_MAX_RESULT_BYTES)),
)
# Django's own cap on a body it reads (2.5 MiB by default) must not undercut
# the API's, or a body between the two would be refused by Django first.
DATA_UPLOAD_MAX_MEMORY_SIZE = max(2_621_440, API_MAX_BODY_BYTES)
# Longest wait_s an admission may ask for.
ADMISSION_MAX_WAIT_S = env.float("ADMISSION_MAX_WAIT_S", default=60.0)
# The console's live regions (console/views/live.py): how long one watch waits for
# a ticket event before it answers "nothing changed" (under proxies' idle
# timeouts and gunicorn's), and how many watches one web process holds at
# once (each holds a thread, no database session): the rest of its threads
# stay for requests. A tab over the limit polls until a slot frees.
CONSOLE_LIVE_WAIT_S = env.float("CONSOLE_LIVE_WAIT_S", default=25.0)
CONSOLE_LIVE_SLOTS = env.int("CONSOLE_LIVE_SLOTS", default=2)
# The web tier of one host, read from the variables deploy/gunicorn.conf.py
# reads, with its defaults: processes x threads is how many requests the
# host runs at once.
WEB_THREADS = env.int("WEB_CONCURRENCY", default=(os.cpu_count() or 1) * 2 + 1) * env.int(
    "GUNICORN_THREADS", default=4
)
# Fair share per user (core/fairshare.py; docs/reference/api.md "Fair share"): every
# API key of a user and their console session share these (a key given
# limits of its own by staff is counted on its own). Admissions per window
# in `limits` notation ("" for none); requests in flight and wait_s waits
# across all web processes (0 for no limit). A wait_s also needs one of this
# process's API_WAIT_SLOTS (0: wait_s never waits); keep API_WAIT_SLOTS +
# CONSOLE_LIVE_SLOTS below GUNICORN_THREADS.
# Admissions: a fan-out of 50 children at once or a loader of 16 threads is
# ordinary use; the window only stops a runaway client.
RATE_LIMIT_ADMISSIONS = env.str("RATE_LIMIT_ADMISSIONS", default="200/second")
# Requests in flight: one host's threads. A burst beyond the threads waits
# in gunicorn's queue rather than being refused; a share below them would
# refuse a burst a host could serve, while what holds a thread for long
# (wait_s, the console's watches) has its own limits. With several hosts
# one caller holds at most one host's worth.
RATE_LIMIT_CONCURRENT_REQUESTS = env.int("RATE_LIMIT_CONCURRENT_REQUESTS", default=WEB_THREADS)
RATE_LIMIT_CONCURRENT_WAITS = env.int("RATE_LIMIT_CONCURRENT_WAITS", default=4)
# Failed API authentications per client address (LOGIN_PROXY_COUNT says how
# to find it behind proxies); past it, 429 before a key is looked up.
RATE_LIMIT_FAILED_AUTH = env.str("RATE_LIMIT_FAILED_AUTH", default="10/second;100/minute")
API_WAIT_SLOTS = env.int("API_WAIT_SLOTS", default=2)
# The obligations sweep has no need to run as often as the others.
OBLIGATION_SWEEP_INTERVAL_S = env.float(
    "OBLIGATION_SWEEP_INTERVAL_S", default=max(SWEEP_INTERVAL_S, 30.0)
)
# Ticket streams (GET /tickets/{id}/stream, tickets/streams.py): one holds a
# web thread (and one of the process's API_WAIT_SLOTS) for at most
# STREAM_MAX_S, then ends and the client resumes with Last-Event-ID; a
# comment every STREAM_HEARTBEAT_S keeps proxies from closing an idle one.
# A user holds at most RATE_LIMIT_CONCURRENT_STREAMS at once across all
# web processes (0: no per-user limit); the next is 429 rate_limited.
STREAM_MAX_S = env.float("STREAM_MAX_S", default=300.0)
STREAM_HEARTBEAT_S = env.float("STREAM_HEARTBEAT_S", default=15.0)
RATE_LIMIT_CONCURRENT_STREAMS = env.int("RATE_LIMIT_CONCURRENT_STREAMS", default=2)

# --- Retention (tickets/retention.py; `manage.py prune_ledger`) ------------------------------
# Off by default (0: keep everything). When set, beat runs prune_ledger every
# RETENTION_INTERVAL_S with --older-than RETENTION_DAYS, RETENTION_BATCH
# traces per transaction.
RETENTION_DAYS = env.float("RETENTION_DAYS", default=0.0)
RETENTION_INTERVAL_S = env.float("RETENTION_INTERVAL_S", default=86400.0)
RETENTION_BATCH = env.int("RETENTION_BATCH", default=500)
# After each batch of t seconds, pause RETENTION_PAUSE_RATIO * t (0 to 10).
RETENTION_PAUSE_RATIO = env.float("RETENTION_PAUSE_RATIO", default=0.0)
if not 0 <= RETENTION_PAUSE_RATIO <= 10:  # refused at start, not at the day's prune
    raise ValueError("RETENTION_PAUSE_RATIO must be between 0 and 10")

# --- Schedules (tickets/schedules.py, docs/howto/schedules.md) -----------------------
# Beat's period for firing due slots (the "schedules" sweep, on the control
# queue): the most a slot fires late while beat and a control worker run.
SCHEDULE_TICK_S = env.float("SCHEDULE_TICK_S", default=1.0)
# The shortest every_s (and the shortest gap between a cron's slots) a
# schedule may have: each slot is a ticket.
SCHEDULE_MIN_INTERVAL_S = env.int("SCHEDULE_MIN_INTERVAL_S", default=60)
# catch_up "none": a slot fires if it is at most this late; older missed
# ones are recorded as skipped. Keep it above SCHEDULE_TICK_S.
SCHEDULE_GRACE_S = env.float("SCHEDULE_GRACE_S", default=60.0)
# catch_up "all": at most this many missed slots (the newest) fire in one
# pass; older ones are recorded as skipped, so an outage never floods an endpoint.
SCHEDULE_MAX_CATCH_UP = env.int("SCHEDULE_MAX_CATCH_UP", default=100)
# Slot outcomes kept per schedule (its API and console show the newest).
SCHEDULE_SLOT_HISTORY = env.int("SCHEDULE_SLOT_HISTORY", default=50)
# Schedules one pass of the sweep handles (the next tick takes the rest).
SCHEDULE_BATCH = env.int("SCHEDULE_BATCH", default=200)

# --- Transient faults (core/transient.py) ------------------------------------
# How long a worker keeps trying to start or finish a turn (record an outcome
# it knows) through a database outage, with capped backoff, before it gives up
# and leaves the turn to the budget sweep.
FINISH_RETRY_MAX_S = env.float("FINISH_RETRY_MAX_S", default=300.0)
# The Retry-After (seconds) of a 503 `unavailable` (database or broker down).
UNAVAILABLE_RETRY_AFTER_S = env.int("UNAVAILABLE_RETRY_AFTER_S", default=3)

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

# --- Runner allow-list (operator's, not staff's) --------------------------------
# A python runner's path must lie inside one of these packages or modules
# ("runtime.demo." allows runtime.demo.echo); a command runner's argv[0]
# must be one of these executables, exactly as written (empty: no commands).
# http runner URLs follow the webhook URL policy (DELIVERY_ALLOWED_HOSTS).
# Checked when an endpoint is created or changed, and again before each turn.
RUNNER_PYTHON_ALLOWED_PREFIXES = env.list(
    "RUNNER_PYTHON_ALLOWED_PREFIXES", default=["runtime.demo."]
)
RUNNER_COMMAND_ALLOWED = env.list("RUNNER_COMMAND_ALLOWED", default=[])
# Named secrets a runner may reference (core/secrets.py): a file of
# NAME=value lines on the worker host, and the environment variables a
# runner may name (nothing else in the environment is reachable).
RUNNER_SECRETS_FILE = env.str("RUNNER_SECRETS_FILE", default="")
RUNNER_SECRET_NAMES = env.list("RUNNER_SECRET_NAMES", default=[])
# The unprivileged user command and process-isolated turns run as, so they
# cannot read the worker's environment (/proc/<pid>/environ), the secrets
# file or var/ (runtime/runas.py, docs/howto/deploy.md "The runner user"). Takes
# effect only in a worker started as root. Unset: "claimcheck-runner" when
# that user exists (a root worker without it warns at start and runs turns
# as root); set: that user, and a worker that cannot switch to it refuses
# to start; empty: off (turns run as the worker's own user).
# Read raw: django-environ takes an empty value for an unset one.
RUNNER_USER = os.environ.get("RUNNER_USER")

# Agent runners (runtime/agents/): how much of the endpoint's history a turn
# loads as the agent's conversation. The newest whole exchanges are kept
# while they fit both caps (an exchange is never cut in half: a tool call
# without its result is not a conversation a model accepts); the exchange a
# turn resumes is always kept. A runner may lower the caps
# (history_max_messages, history_max_bytes), never raise them.
AGENT_HISTORY_MAX_ENTRIES = env.int("AGENT_HISTORY_MAX_ENTRIES", default=500)
AGENT_HISTORY_MAX_MESSAGES = env.int("AGENT_HISTORY_MAX_MESSAGES", default=400)
AGENT_HISTORY_MAX_BYTES = env.int("AGENT_HISTORY_MAX_BYTES", default=2_000_000)
# Rounds of pending calls (delegations, approvals) one agent exchange may
# have: each resumed turn that asks again starts a round; one past the cap
# fails the exchange (agent_max_rounds). A runner may lower it (max_rounds).
AGENT_MAX_ROUNDS = env.int("AGENT_MAX_ROUNDS", default=10)
# Agent frameworks a worker imports and warms before it forks its pool
# (pydantic_ai, openai_agents): otherwise the first agent turn of each pool
# process pays for it (seconds) inside its budget.
AGENT_PRELOAD = env.list("AGENT_PRELOAD", default=[])

# --- Celery -------------------------------------------------------------------
# The longest turn budget (and grace, heartbeat timeout) an endpoint may have:
# 7 days. One source for the cap (endpoints.services) and the broker's
# visibility timeout below, which must exceed it.
MAX_TURN_BUDGET_S = 7 * 24 * 3600
# Governed change: may the proposer of an endpoint change approve it
# themselves? Not by default (another owner or staff reviews it); an
# endpoint's own change_requires_second_person overrides this.
CHANGE_REQUIRES_SECOND_PERSON = env.bool("CHANGE_REQUIRES_SECOND_PERSON", default=True)
# No CELERY_BROKER_URL: the embedded Redis on its unix socket.
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="") or embedded.broker_url(VAR_DIR)
# Where the fair-share counters live (core/fairshare.py): the broker's
# Redis by default (its unix socket in the embedded default); "memory://":
# each process counts alone. Unreachable: requests pass unlimited, with a
# WARNING (fail open).
RATE_LIMIT_STORAGE_URL = env.str(
    "RATE_LIMIT_STORAGE_URL",
    default=(
        CELERY_BROKER_URL
        if CELERY_BROKER_URL.startswith(("redis://", "rediss://"))
        else CELERY_BROKER_URL.replace("redis+socket://", "redis+unix://", 1)
        if CELERY_BROKER_URL.startswith("redis+socket://")
        else ""
    ),
)
# The visibility timeout must exceed the longest turn budget
# (MAX_TURN_BUDGET_S, the cap endpoints.services enforces), so a message
# is never redelivered while its turn may still run; a redelivered message
# then finds its ticket no longer queued and does nothing.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": MAX_TURN_BUDGET_S + 3600}
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Celery's Django fixup closes every database connection before and after
# every task unless this is set: each turn then paid a new PostgreSQL session
# (a backend fork, authentication, Django's set-up queries) and its
# prepared statements were lost with it. Set, the fixup closes them only every
# DB_REUSE_MAX tasks; between tasks config/celery.py closes a connection only
# when CONN_MAX_AGE says so or it failed, as Django does between requests.
CELERY_DB_REUSE_MAX = env.int("CELERY_DB_REUSE_MAX", default=1000)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# --- Logs (core/logs.py) and metrics (config/metrics.py) ------------------------------------
# json: one JSON object per line (production); console: the classic line with
# the ids appended (`make run`). Both carry request, ticket, turn and trace ids.
LOG_FORMAT = env.str("LOG_FORMAT", default="console")
LOG_LEVEL = env.str("LOG_LEVEL", default="INFO").upper()
LOGGING = logs_config(fmt=LOG_FORMAT, level=LOG_LEVEL)
# Celery workers and beat use LOGGING too (config/celery.py connects setup_logging).
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Who may read /metrics: a client address in METRICS_ALLOWED_IPS (addresses or
# networks, matched against REMOTE_ADDR), or a request with
# "Authorization: Bearer <METRICS_BEARER_TOKEN>". Anyone else: 404.
METRICS_ALLOWED_IPS = env.list("METRICS_ALLOWED_IPS", default=["127.0.0.1", "::1"])
METRICS_BEARER_TOKEN = env.str("METRICS_BEARER_TOKEN", default="")
# PROMETHEUS_MULTIPROC_DIR (read by prometheus-client itself, from the
# environment): one directory per host shared by gunicorn and the Celery
# workers, emptied before they start (docs/howto/operations.md).

# Turns can occupy every worker process for their whole budget; sweeps and
# deliveries get their own queue so a full pool can never starve the sweeps
# that enforce budgets. `make run` starts a worker for each queue.
CELERY_TASK_DEFAULT_QUEUE = "turns"
CELERY_TASK_ROUTES = {
    "runtime.sweep_*": {"queue": "control"},
    "tickets.sweep_*": {"queue": "control"},
    "tickets.deliver": {"queue": "control"},
    "tickets.prune_ledger": {"queue": "control"},
}
