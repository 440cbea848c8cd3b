"""Where `make run`'s embedded PostgreSQL and Redis live (docs/reference/commands.md,
"make run").

Both listen on unix sockets only, in one directory whose path is a pure
function of ``var/``: the supervisor (scripts/run.py) starts the servers
there, and settings point a plain ``python manage.py ...`` or ``celery``
with no ``DATABASE_URL`` / ``CELERY_BROKER_URL`` at the same sockets, with
no state file to read or go stale. Nothing listens on a TCP port, so two
checkouts never collide and no other user of the machine can connect (the
directory is mode 0700).

This module imports nothing of Django: the supervisor uses it before any
settings exist.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from urllib.parse import quote, unquote

BASE_DIR = Path(__file__).resolve().parent.parent

# The cluster's roles and database, as `make test` and production name them
# (docs/howto/production.md): the owner migrates, the application role runs.
SUPERUSER = "postgres"
OWNER_ROLE = "claimcheck_owner"
APP_ROLE = "claimcheck_app"
DATABASE = "claimcheck"

# A unix socket's path must fit sun_path (108 bytes with the NUL on Linux).
_SUN_PATH_MAX = 107
_LONGEST_SOCKET = ".s.PGSQL.5432.lock"


def var_dir() -> Path:
    return Path(os.environ.get("CLAIMCHECK_VAR_DIR") or BASE_DIR / "var").resolve()


def socket_dir(var: Path | None = None) -> Path:
    """``var/run``, or, where that path is too long for a unix socket, a
    directory under the temporary directory named by a digest of ``var/``
    (the same checkout always gets the same one)."""
    var = var or var_dir()
    preferred = var / "run"
    if len(str(preferred / _LONGEST_SOCKET)) <= _SUN_PATH_MAX:
        return preferred
    digest = hashlib.sha256(str(var).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"claimcheck-{digest}"


def database_url(role: str, var: Path | None = None) -> str:
    """A libpq URL for ``role`` on the embedded cluster's socket (the socket
    directory percent-encoded in the host part, as libpq reads it)."""
    return f"postgres://{role}@{quote(str(socket_dir(var)), safe='')}/{DATABASE}"


def broker_url(var: Path | None = None) -> str:
    return f"redis+socket://{socket_dir(var) / 'redis.sock'}"


def unquote_host(config: dict) -> dict:
    """django-environ keeps a percent-encoded socket directory as it is;
    libpq needs the path."""
    host = config.get("HOST") or ""
    if host.lower().startswith("%2f"):
        config["HOST"] = unquote(host)
    return config
