"""Named secrets resolve from the worker host's file, then from allow-listed
environment variables; nothing else in the environment is reachable."""

from __future__ import annotations

import pytest

from core.errors import Invalid
from core.secrets import SecretMissing, secret


def test_secret_from_file_wins_and_follows_edits(tmp_path, settings):
    path = tmp_path / "secrets"
    path.write_text("# comment\nAGENT_TOKEN=from-file\nbad name=x\n")
    settings.RUNNER_SECRETS_FILE = str(path)
    assert secret("AGENT_TOKEN") == "from-file"
    path.write_text("AGENT_TOKEN=edited\n")
    import os

    os.utime(path, ns=(1, 10**18))  # a new mtime, whatever the clock's resolution
    assert secret("AGENT_TOKEN") == "edited"


def test_environment_only_for_listed_names(monkeypatch, settings):
    settings.RUNNER_SECRETS_FILE = ""
    monkeypatch.setenv("AGENT_TOKEN", "from-env")
    monkeypatch.setenv("SECRET_KEY", "never")
    settings.RUNNER_SECRET_NAMES = ["AGENT_TOKEN"]
    assert secret("AGENT_TOKEN") == "from-env"
    with pytest.raises(SecretMissing) as missing:
        secret("SECRET_KEY")
    assert "never" not in str(missing.value)


@pytest.mark.parametrize("name", ["", "lower", "1ABC", "A-B", "A" * 129, None])
def test_bad_names_are_invalid(name):
    with pytest.raises(Invalid):
        secret(name)
