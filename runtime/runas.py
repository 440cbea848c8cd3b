"""Who a turn's own process runs as (docs/howto/deploy.md, "The runner user").

A command's process and a process-isolated turn's process run as
``RUNNER_USER``, an unprivileged user that is not the worker's. What a turn
runs (an interpreter, a file-reading binary, an agent's tool) then cannot
read the worker's environment through ``/proc/<pid>/environ`` (the kernel
shows it to the same user or root only), the runner secrets file (mode 0640,
root and the worker's group) or the worker's files under ``var/`` (0600).
It gets the secrets its runner names and nothing else: a command in its
environment, an isolated turn through its supervisor (``core.secrets.confine``).

Only a worker started as root switches: a command starts through
util-linux's ``setpriv`` (``--reuid --regid --clear-groups``), the forked
turn process calls ``setgroups``/``setresgid``/``setresuid``. (``subprocess``'s
own ``user``/``group`` would do for a command too, but they make it fork the
whole worker instead of using vfork, a cost that grows with the worker's
memory on every command.) Going
from root to an unprivileged user clears every capability (the kernel's
rule for a change of user ids away from 0), so nothing the turn runs can
switch back; and root signals the runner user's process groups (the
interrupt's SIGTERM and SIGKILL) and reaps them as before. A worker started
as another user would need CAP_SETUID, which makes it root-equivalent
anyway, and ambient capabilities its children keep across ``exec`` unless
each child clears them by hand: it runs turns as itself (a turn then reads
what that user reads), and says so at start.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import stat
from dataclasses import dataclass

from django.conf import settings

log = logging.getLogger(__name__)

DEFAULT_USER = "claimcheck-runner"
# What a process-isolated turn keeps of the worker's environment (a command
# gets ``COMMAND_BASE_ENV`` and its named secrets, endpoints/runner_spec.py).
KEPT_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "DJANGO_SETTINGS_MODULE")


class Unavailable(Exception):
    """The runner user is required and this worker cannot run turns as it."""


@dataclass(frozen=True)
class RunAs:
    name: str
    uid: int
    gid: int
    home: str
    setpriv: str


def _configured() -> tuple[str, bool]:
    """The user's name ("": off) and whether the operator set it."""
    value = getattr(settings, "RUNNER_USER", None)
    if value is None:
        return DEFAULT_USER, False
    return str(value).strip(), True


def _lookup(name: str) -> RunAs:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise Unavailable(f"RUNNER_USER {name} does not exist on this host") from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise Unavailable(f"RUNNER_USER {name} is root or in group root: not unprivileged")
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if setpriv is None:
        raise Unavailable("setpriv (util-linux) is not installed: commands cannot switch users")
    home = entry.pw_dir or "/"
    return RunAs(name=name, uid=entry.pw_uid, gid=entry.pw_gid, home=home, setpriv=setpriv)


def current() -> RunAs | None:
    """The user this worker runs the next command or isolated turn as; None:
    as itself (a non-root worker, the setting off, or the default user
    missing, which ``check_at_start`` warned about). ``Unavailable`` when the
    operator named a user this root worker cannot find (removed since the
    start): the turn fails rather than run as root."""
    name, explicit = _configured()
    if not name or os.geteuid() != 0:
        return None
    try:
        return _lookup(name)
    except Unavailable:
        if explicit:
            raise
        return None


def check_at_start() -> None:
    """In a turns worker's main process, before it forks its pool: a user
    the operator named must be usable (else ``Unavailable``: the worker
    refuses to start), and running turns as root is said loudly."""
    name, explicit = _configured()
    root = os.geteuid() == 0
    if not name:  # the operator's choice, said once
        log.info("RUNNER_USER is empty: turns run as this worker's user (uid %s)", os.geteuid())
        return
    if not root:
        if explicit:
            raise Unavailable(
                f"RUNNER_USER={name} needs the turns worker to start as root (it switches "
                f"each turn's process to {name}); this worker runs as uid {os.geteuid()}. "
                "Start it as root (docs/howto/deploy.md, 'The runner user') or set RUNNER_USER= "
                "to run turns as this worker's user"
            )
        log.info("turns run as this worker's user (uid %s): not started as root", os.geteuid())
        return
    try:
        user = _lookup(name)
    except Unavailable as exc:
        if explicit:
            raise Unavailable(
                f"{exc}: create it (useradd --system --no-create-home --shell "
                f"/usr/sbin/nologin {name}) or set RUNNER_USER= to run turns as root"
            ) from None
        log.warning(
            "user %s does not exist: command and process-isolated turns run as ROOT and can "
            "read this worker's environment, the runner secrets file and var/. Create it "
            "(useradd --system --no-create-home --shell /usr/sbin/nologin %s) or set "
            "RUNNER_USER (docs/howto/deploy.md, 'The runner user')",
            name,
            name,
        )
        return
    log.info("command and process-isolated turns run as %s (uid %s)", user.name, user.uid)
    _check_modes()


def _check_modes() -> None:
    """What the runner user could still read by mode: said at start."""
    checks = (
        (getattr(settings, "RUNNER_SECRETS_FILE", "") or "", stat.S_IROTH, "chmod 0640 it"),
        (str(settings.VAR_DIR), stat.S_IXOTH, "chmod 0770 it (artifacts, generated secrets)"),
    )
    for path, bit, fix in checks:
        try:
            mode = os.stat(path).st_mode if path else 0
        except OSError:
            continue
        if mode & bit:
            log.warning("%s is open to every user, the runner user included: %s", path, fix)


def command(
    user: RunAs | None, argv: list[str], env: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start a command as ``user``: its ids,
    no supplementary group of the worker's, no gain of privileges through a
    set-user-ID binary, and its own HOME. ``setpriv`` execs the command in
    its own process: the pid, the process group and the ``waitpid`` status
    are the command's."""
    if user is None:
        return argv, env
    switch = [
        user.setpriv,
        f"--reuid={user.uid}",
        f"--regid={user.gid}",
        "--clear-groups",
        "--no-new-privs",
        "--",
    ]
    return [*switch, *argv], ({**env, "HOME": user.home} if "HOME" in env else env)


def become(user: RunAs) -> None:
    """In a forked turn process, before any turn: drop to ``user`` for good
    and forget the worker's environment and secrets. The kernel also makes
    the process non-dumpable on the change of user, so its own
    ``/proc/self/environ`` (the worker's first environment, still in its
    memory) is out of the turn's reach. What stays readable is the rest of
    the fork's memory: the worker's loaded settings (docs/howto/deploy.md)."""
    from core import secrets

    os.setgroups([])
    os.setresgid(user.gid, user.gid, user.gid)
    os.setresuid(user.uid, user.uid, user.uid)
    if os.getresuid() != (user.uid,) * 3 or os.getgroups():  # never run a turn half-dropped
        raise Unavailable(f"the turn process could not become {user.name}")
    kept = {k: v for k, v in os.environ.items() if k in KEPT_ENV}
    os.environ.clear()
    os.environ.update(kept, HOME=user.home, USER=user.name, LOGNAME=user.name)
    secrets.confine({})
