"""The agent runner's configuration: its fields only, its path under the
operator's allow-list, credentials only as named secrets."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db

AGENT = {"kind": "agent", "framework": "pydantic_ai", "path": "runtime.demo.agent"}


@pytest.mark.parametrize(
    ("runner", "names"),
    [
        ({**AGENT, "model_key": "sk-123"}, "model_key"),
        ({**AGENT, "framework": "crewai"}, "framework"),
        ({**AGENT, "path": "os.system"}, "RUNNER_PYTHON_ALLOWED_PREFIXES"),
        ({**AGENT, "secrets": {"OPENAI_API_KEY": "sk-live value"}}, "secrets.OPENAI_API_KEY"),
        ({**AGENT, "secrets": {"NOT A NAME": "NAME"}}, "variable name"),
        ({**AGENT, "history_max_messages": 0}, "history_max_messages"),
        ({**AGENT, "delegate_to": "demo.echo"}, "delegate_to"),
    ],
)
def test_a_bad_agent_runner_is_400_naming_what(api, runner, names):
    resp = api.post("/endpoints", {"address": "bad.agent", "runner": runner})
    assert resp.status_code == 400, resp.json()
    assert resp.json()["error"] == "invalid" and names in resp.json()["detail"]


def test_an_agent_runner_with_named_secrets_is_accepted(api):
    runner = {
        **AGENT,
        "delegate_to": ["demo.echo"],
        "history_max_messages": 50,
        "secrets": {"OPENAI_API_KEY": "RESEARCH_OPENAI_KEY"},
    }
    resp = api.post("/endpoints", {"address": "good.agent", "runner": runner})
    assert resp.status_code == 201, resp.json()
    assert resp.json()["runner"] == runner


def test_a_langgraph_runner_is_accepted(api):
    runner = {**AGENT, "framework": "langgraph", "path": "tests.agents.langgraph_agent.build"}
    resp = api.post("/endpoints", {"address": "graph.agent", "runner": runner})
    assert resp.status_code == 201, resp.json()
    assert resp.json()["runner"] == runner
