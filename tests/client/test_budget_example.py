"""docs/howto/trace-budgets.md's example, run as written against the live server and a
real worker (the demo agent's offline model): a few tickets succeed, the
trace warns once and closes once, and the next submission is refused."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "howto" / "trace-budgets.md"
AGENT = {"kind": "agent", "framework": "pydantic_ai", "path": "runtime.demo.agent"}


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_the_budget_docs_example_runs_offline(worker, server, api_key, make_endpoint):
    make_endpoint("demo.agent", runner=AGENT)
    [code] = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    code = code.replace('open("var/demo_api_key").read().strip()', repr(api_key))
    code = code.replace('"http://127.0.0.1:8000"', repr(server))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOC), "exec"), {})  # noqa: S102 - the documented example
    printed = out.getvalue()
    assert printed.startswith("root succeeded"), printed
    assert re.search(r"^refused after \d+ more tickets: trace .* spent its budget", printed, re.M)
    assert printed.count("trace_budget_warning") == 1, printed
    assert printed.count("trace_budget_exhausted") == 1, printed
