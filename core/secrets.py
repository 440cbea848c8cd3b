"""Named secrets: credentials a runner needs, held on the worker host and
referenced by name, never stored in the ledger, a runner dict or a log.

A runner names a secret (``"auth": {"secret": "RESEARCH_AGENT_TOKEN"}``);
the worker resolves the name when the turn runs. A name resolves from, in
order:

1. the secrets file ``RUNNER_SECRETS_FILE`` on the worker host (``NAME=value``
   lines, ``#`` comments; re-read when its mtime changes), then
2. the worker's environment, but only for names listed in
   ``RUNNER_SECRET_NAMES``: a staff member who configures a runner must not
   be able to send ``DATABASE_URL`` or ``SECRET_KEY`` to an agent of theirs.

A turn's process that runs as the runner user (runtime/runas.py) reads
neither: it resolves only the names its runner declares, which its
supervisor resolved for it (``confine``).

A name that resolves nowhere raises :class:`SecretMissing`; its message
names the secret, never a value.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

from django.conf import settings

from core.errors import Invalid

NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,127}$")

_lock = threading.Lock()
_cache: dict[str, object] = {"path": None, "mtime": None, "values": {}}
# In a turn's process that runs as the runner user (runtime/runas.py): the
# secrets its runner names, handed over by its supervisor; None elsewhere
# (the file and the environment are read).
_confined: dict[str, str] | None = None


class SecretMissing(Invalid):
    """A runner names a secret this host does not hold."""


def check_name(name: object) -> str:
    """The name itself, when it is a valid secret name; ``Invalid`` otherwise."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise Invalid(
            "a secret name is 1 to 128 characters of A-Z, 0-9 and _, starting with a letter"
        )
    return name


def _file_values() -> dict[str, str]:
    path = getattr(settings, "RUNNER_SECRETS_FILE", "") or ""
    if not path:
        return {}
    try:
        mtime = Path(path).stat().st_mtime_ns
    except OSError:
        return {}
    with _lock:
        if _cache["path"] == path and _cache["mtime"] == mtime:
            return _cache["values"]  # type: ignore[return-value]
        values: dict[str, str] = {}
        for line in Path(path).read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, _, value = line.partition("=")
            key = key.strip()
            if NAME_RE.match(key):
                values[key] = value.strip()
        _cache.update(path=path, mtime=mtime, values=values)
        return values


def confine(values: dict[str, str]) -> None:
    """From now on this process resolves only ``values`` (the secrets the
    running turn's runner names), never the file or the environment, and
    forgets the file's values it had read (a forked process inherits them)."""
    global _confined
    _confined = dict(values)
    with _lock:
        _cache.update(path=None, mtime=None, values={})


def secret(name: str) -> str:
    """The value of the named secret on this host; :class:`SecretMissing` if none."""
    check_name(name)
    if _confined is not None:
        if name in _confined:
            return _confined[name]
        raise SecretMissing(f"secret {name} is not held on this worker host")
    values = _file_values()
    if name in values:
        return values[name]
    if name in set(getattr(settings, "RUNNER_SECRET_NAMES", []) or []):
        value = os.environ.get(name)
        if value is not None:
            return value
    raise SecretMissing(f"secret {name} is not held on this worker host")
