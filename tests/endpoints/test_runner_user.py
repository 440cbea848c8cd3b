"""Command and process-isolated turns run as another, unprivileged user
(``RUNNER_USER``, docs/howto/deploy.md "The runner user"): the worker's
environment (``/proc/<worker>/environ``), the runner secrets file and the
worker's files are out of their reach, and a turn gets only the secrets its
runner names. Needs root (the tests create their runner user)."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from endpoints.models import Endpoint
from runtime import isolation
from runtime import turns as runtime
from tests.conftest import wait_for
from tickets.admission import admit_ticket
from tickets.models import Ticket, Turn

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")

RUNNER = "cc-test-runner"
# A system interpreter the runner user may execute (this machine's
# project interpreter lives under /root, which that user cannot enter).
PYTHON = "/usr/bin/python3"
NAMED = "NAMED-SECRET-5d1e0c"
OTHER = "OTHER-TENANT-SECRET-9b7a44"


@pytest.fixture(scope="session")
def runner_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(RUNNER)
    except KeyError:
        pass
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", RUNNER],
        check=True,
    )
    return pwd.getpwnam(RUNNER)


@pytest.fixture
def secrets_file(settings):
    """The runner secrets file as docs/howto/deploy.md sets it: mode 0640, owned
    by root and the worker's group, in a directory anyone may enter (so a
    refusal is the file's own mode, not its directory's)."""
    folder = Path(tempfile.mkdtemp(prefix="cc-runner-secrets-"))
    folder.chmod(0o755)
    path = folder / "runner-secrets"
    path.write_text(f"RUNNER_TOKEN={NAMED}\nOTHER_TENANT_TOKEN={OTHER}\n")
    path.chmod(0o640)
    settings.RUNNER_SECRETS_FILE = str(path)
    yield path
    shutil.rmtree(folder)


@pytest.fixture
def as_runner(settings, runner_user):
    settings.RUNNER_USER = RUNNER
    settings.RUNNER_COMMAND_ALLOWED = [*settings.RUNNER_COMMAND_ALLOWED, PYTHON]
    yield runner_user
    # Warm turn processes of this user must not serve the tests after.
    isolation.retire_idle()


READS = textwrap.dedent(
    """
    import json, os, sys
    envelope = json.load(sys.stdin)
    def read(path):
        try:
            with open(path, "rb") as fh:
                return fh.read().decode(errors="replace").replace("\\0", "\\n")
        except OSError as exc:
            return type(exc).__name__
    print(json.dumps({"result": {
        "uid": os.getuid(),
        "env": sorted(os.environ),
        "token_sha": __import__("hashlib").sha256(os.environ["TOKEN"].encode()).hexdigest(),
        "worker_environ": read("/proc/%d/environ" % os.getppid()),
        "secrets_file": read(sys.argv[1]),
        "secret_key_file": read(sys.argv[2]),
    }}))
    """
)


def _leaks(value, *secrets: str) -> list[str]:
    text = json.dumps(value)
    return [s for s in secrets if s in text]


@pytest.mark.django_db
def test_a_command_turn_cannot_read_the_workers_environment_or_secrets_file(
    as_runner, secrets_file, make_endpoint, settings
):
    database_url = os.environ["DATABASE_URL"]  # in this process's /proc/<pid>/environ
    secret_key_file = settings.VAR_DIR / "secret_key"
    secret_key_file.touch(mode=0o600, exist_ok=True)
    make_endpoint(
        "reader",
        runner={
            "kind": "command",
            "argv": [PYTHON, "-c", READS, str(secrets_file), str(secret_key_file)],
            "env": {"TOKEN": {"secret": "RUNNER_TOKEN"}},
        },
    )
    ticket = admit_ticket(endpoint="reader", input={}).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    ticket = Ticket.objects.get(id=ticket.id)
    assert ticket.state == "succeeded", ticket.error
    seen = ticket.result
    assert seen["worker_environ"] == "PermissionError"
    assert seen["secrets_file"] == "PermissionError"
    assert seen["secret_key_file"] == "PermissionError"
    assert seen["uid"] == as_runner.pw_uid
    # It got the secret its runner names, and nothing else of the worker's.
    assert seen["token_sha"] == hashlib.sha256(NAMED.encode()).hexdigest()
    assert "DATABASE_URL" not in seen["env"]
    assert not _leaks(seen, OTHER, NAMED, database_url)


@pytest.mark.django_db
def test_a_process_isolated_turn_runs_as_the_runner_user_without_the_workers_secrets(
    as_runner, secrets_file, make_endpoint, monkeypatch
):
    database_url = os.environ["DATABASE_URL"]
    # In the worker's environment, as on a production host.
    monkeypatch.setenv("SECRET_KEY", "worker-secret-key-3f9a")
    make_endpoint("isolated.reader", path="tests.endpoints.runuser_runners.reaches")
    ticket = admit_ticket(
        endpoint="isolated.reader",
        input={"secrets_file": str(secrets_file), "secret": "OTHER_TENANT_TOKEN"},
    ).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    ticket = Ticket.objects.get(id=ticket.id)
    assert ticket.state == "succeeded", ticket.error
    seen = ticket.result
    assert not {"DATABASE_URL", "SECRET_KEY"} & set(seen["env"])
    assert seen["supervisor_environ"] == "PermissionError"
    # The fork's own first environment is the worker's: out of reach too.
    assert seen["own_environ"] == "PermissionError"
    assert seen["secrets_file"] == "PermissionError"
    # A secret its runner does not name does not resolve in the turn.
    assert seen["secret"] == "SecretMissing"
    assert not _leaks(seen, OTHER, NAMED, database_url, "worker-secret-key-3f9a")
    assert seen["uid"] == as_runner.pw_uid


STUBBORN = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    json.load(sys.stdin)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(sys.argv[1] + ".tmp", "w") as fh:
        json.dump({"leader": os.getpid(), "child": child.pid}, fh)
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(120)  # the behaviour under test: a command's own work
    """
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_an_interrupt_stops_a_runner_users_command_with_evidence(
    as_runner, celery_procs, make_endpoint
):
    shared = Path(tempfile.mkdtemp(prefix="cc-runner-pids-"))
    shared.chmod(0o777)  # the runner user writes its pids here
    pids = shared / "pids.json"
    try:
        celery_procs.env["RUNNER_USER"] = RUNNER
        celery_procs.env["RUNNER_COMMAND_ALLOWED"] = f"{sys.executable},{PYTHON}"
        celery_procs.worker(embedded_beat=True)
        make_endpoint(
            "stubborn",
            runner={"kind": "command", "argv": [PYTHON, "-c", STUBBORN, str(pids)]},
            turn_budget_s=1.5,
            interrupt_grace_s=8,
        )
        ticket = admit_ticket(endpoint="stubborn", input={}).ticket
        wait_for(pids.exists, timeout=60, message="the command to start")
        procs = json.loads(pids.read_text())
        assert os.stat(f"/proc/{procs['leader']}").st_uid == as_runner.pw_uid
        wait_for(
            lambda: Ticket.objects.get(id=ticket.id).state == "failed",
            timeout=30,
            message="the interrupted turn to stop",
        )
        t = Ticket.objects.get(id=ticket.id)
        assert t.error["code"] == "timed_out"
        turn = Turn.objects.get(ticket=ticket)
        assert turn.state == "stopped"
        assert turn.stop_evidence["kind"] == "process_exit"
        assert turn.stop_evidence["detail"]["signal"] == "SIGTERM"
        wait_for(
            lambda: not _alive(procs["leader"]) and not _alive(procs["child"]),
            timeout=10,
            message="leader and grandchild to be gone",
        )
        assert Endpoint.objects.get(address="stubborn").state == "available"
        # The same worker's process-isolated turns run as the runner user.
        make_endpoint("isolated.worker", path="tests.endpoints.runuser_runners.reaches")
        ticket = admit_ticket(
            endpoint="isolated.worker", input={"secrets_file": "/nonexistent", "secret": "X"}
        ).ticket
        wait_for(
            lambda: Ticket.objects.get(id=ticket.id).state in ("succeeded", "failed"),
            timeout=60,
            message="the isolated turn",
        )
        t = Ticket.objects.get(id=ticket.id)
        assert t.state == "succeeded", t.error
        assert t.result["uid"] == as_runner.pw_uid
        assert t.result["supervisor_environ"] == "PermissionError"
        assert "DATABASE_URL" not in t.result["env"]
    finally:
        shutil.rmtree(shared)


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_root_worker_refuses_to_start_with_a_runner_user_that_does_not_exist(celery_procs):
    celery_procs.env["RUNNER_USER"] = "cc-no-such-runner"
    proc = celery_procs.start("turns", "worker", "-Q", "turns", "-c", "1", "-n", "nouser@%h")
    assert proc.wait(timeout=60) != 0
    log = celery_procs.log("turns").decode(errors="replace")
    assert "RUNNER_USER" in log and "cc-no-such-runner" in log and "does not exist" in log


@pytest.mark.django_db(transaction=True)
def test_an_agent_turn_as_the_runner_user_gets_its_named_secret_and_its_memory(
    as_runner, secrets_file, make_endpoint
):
    make_endpoint("demo.echo")
    make_endpoint(
        "environ.agent",
        runner={
            "kind": "agent",
            "framework": "pydantic_ai",
            "path": "tests.agents.environ_agent.agent",
            "secrets": {"CC_AGENT_MODEL_KEY": "RUNNER_TOKEN"},
        },
    )
    ticket = admit_ticket(endpoint="environ.agent", input={"prompt": "who"}).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    ticket = Ticket.objects.get(id=ticket.id)
    assert ticket.state == "succeeded", ticket.error
    seen = json.loads(ticket.result)
    assert seen == {
        "uid": as_runner.pw_uid,
        "key_sha": hashlib.sha256(NAMED.encode()).hexdigest(),
        "worker_env": [],
    }
    # The conversation's artifacts, written and read back through the
    # supervisor (the runner user cannot open var/).
    make_endpoint(
        "demo.agent",
        runner={"kind": "agent", "framework": "pydantic_ai", "path": "runtime.demo.agent"},
    )
    for prompt, answer in [
        ("remember the code is 42", "noted: the code is 42 (0 earlier prompts)"),
        ("recall", "I remember: the code is 42"),
    ]:
        asked = admit_ticket(endpoint="demo.agent", input={"prompt": prompt}).ticket
        runtime.run_ticket(ticket_id=asked.id)
        asked = Ticket.objects.get(id=asked.id)
        assert asked.state == "succeeded", asked.error
        assert asked.result == answer


@pytest.mark.django_db
def test_the_escalation_stops_a_runner_users_isolated_turn_with_evidence(as_runner, make_endpoint):
    make_endpoint(
        "isolated.stubborn",
        runner={
            "kind": "python",
            "path": "tests.endpoints.runuser_runners.ignores_sigterm",
            "kill_after_s": 0.5,
        },
        turn_budget_s=1,
        interrupt_grace_s=1,
    )
    ticket = admit_ticket(endpoint="isolated.stubborn", input={}).ticket
    runtime.run_ticket(ticket_id=ticket.id)
    ticket = Ticket.objects.get(id=ticket.id)
    assert ticket.state == "failed", ticket.error
    evidence = Turn.objects.get(ticket=ticket).stop_evidence
    assert evidence["kind"] == "process_exit"
    assert evidence["detail"]["signal"] == "SIGKILL"
    assert evidence["detail"]["signals_sent"] == ["SIGTERM", "SIGKILL"]
    assert Endpoint.objects.get(address="isolated.stubborn").state == "available"


# --- What a turns worker checks at its start ---------------------------------------------------


def test_a_root_worker_without_the_default_user_says_turns_run_as_root(
    settings, monkeypatch, caplog
):
    from runtime import runas

    settings.RUNNER_USER = None  # unset
    monkeypatch.setattr(runas, "DEFAULT_USER", "cc-no-such-runner")
    with caplog.at_level("WARNING", logger="runtime.runas"):
        runas.check_at_start()
    assert "run as ROOT" in caplog.text and "cc-no-such-runner" in caplog.text
    assert runas.current() is None


def test_a_named_runner_user_the_worker_cannot_switch_to_stops_it(
    settings, monkeypatch, runner_user
):
    from runtime import runas

    settings.RUNNER_USER = "root"
    with pytest.raises(runas.Unavailable, match="not unprivileged"):
        runas.check_at_start()
    settings.RUNNER_USER = RUNNER
    monkeypatch.setattr(runas.os, "geteuid", lambda: 1000)
    with pytest.raises(runas.Unavailable, match="needs the turns worker to start as root"):
        runas.check_at_start()


def test_the_start_warns_of_a_secrets_file_every_user_may_read(
    settings, secrets_file, runner_user, caplog
):
    from runtime import runas

    settings.RUNNER_USER = RUNNER
    secrets_file.chmod(0o644)
    with caplog.at_level("WARNING", logger="runtime.runas"):
        runas.check_at_start()
    assert f"{secrets_file} is open to every user" in caplog.text


def test_a_runner_users_turn_process_still_dies_with_its_supervisor(as_runner):
    """A change of user clears PR_SET_PDEATHSIG: the turn process arms it
    after dropping to the runner user. The death signal follows the thread
    that forked, so a process forked by a thread that ends must die."""
    import signal
    import threading

    from runtime import runas

    box = {}

    def fork_and_leave():
        child = isolation._spawn(runas.current())
        box["child"] = child

        def waiting_for_its_turn() -> bool:  # blocked in read(2) on its pipe: past the prctl
            with open(f"/proc/{child.pid}/syscall") as f:
                return f.read().split()[0] == "0"

        wait_for(waiting_for_its_turn, timeout=30, message="the turn process to wait for a turn")

    thread = threading.Thread(target=fork_and_leave)
    thread.start()
    thread.join(60)
    child = box["child"]
    statuses = []

    def died() -> bool:
        status = isolation._exited(child)
        if status is not None:
            statuses.append(status)
        return bool(statuses)

    try:
        wait_for(died, timeout=10, message="the turn process to die with its forking thread")
    finally:
        child.conn.close()
        if not statuses:
            os.kill(child.pid, signal.SIGKILL)
            os.waitpid(child.pid, 0)
    assert os.WIFSIGNALED(statuses[0]) and os.WTERMSIG(statuses[0]) == signal.SIGKILL
