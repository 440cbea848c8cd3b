"""A literal credential in a runner's settings is refused in every form it
is recognisable in (endpoints/runner_spec.py, docs/reference/api.md "Credentials are
named secrets"): by the name it stands under (a header, a query or fragment
parameter, an argv option, alone or followed by its value), by the shape of
the value itself (a provider's key format, a JWT, a private key block),
wherever it stands. The refusal names the field, never the value; a named
secret is always accepted.

The fake values below are built from pieces so that no whole key sits in
the source for a scanner to flag."""

from __future__ import annotations

import pytest

from endpoints import runner_spec
from endpoints.models import Endpoint

URL = "https://agent.example/turn"
FILLER = "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8s9T0"  # 40 mixed characters

OPENAI = "sk-" + FILLER[:32]
OPENAI_PROJECT = "sk-" + "proj-" + FILLER + "_x-" + FILLER[:20]
AWS = "AKIA" + "IOSFODNN7" + "EXAMPLE"
GITHUB_CLASSIC = "ghp" + "_" + FILLER[:36]
GITHUB_FINE = "github" + "_pat_" + "11ABCDEFG0" + FILLER[:12] + "_" + FILLER
SLACK = "xox" + "b-" + "1234567890-1234567890123-" + FILLER[:24]
JWT = "eyJ" + "hbGciOiJIUzI1NiJ9" + "." + "eyJ" + "zdWIiOiIxMjM0In0" + "." + FILLER[:43]
STRIPE = "sk" + "_live_" + FILLER[:24]
GOOGLE = "AI" + "za" + "Sy" + FILLER[:33]
PEM = "-----BEGIN " + "RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----"
PLAIN = "hunter2-correct-horse"  # no shape: only where it stands gives it away


def http(**fields):
    return {"kind": "http", "url": URL, **fields}


def header(value, name="X-Upstream"):
    return http(headers={name: value})


def command(*argv, program="/usr/local/bin/tool"):
    return {"kind": "command", "argv": [program, *argv]}


# (form, runner, what the refusal names, the value that must not be repeated)
REFUSED = [
    # A key's shape, whatever header carries it.
    ("sk- key in a header value", header(OPENAI), "headers.X-Upstream", OPENAI),
    ("sk-proj- key in a header value", header(OPENAI_PROJECT), "OpenAI", OPENAI_PROJECT),
    ("AWS access key id in a header", header(AWS), "AWS", AWS),
    ("GitHub classic token in a header", header(GITHUB_CLASSIC), "GitHub", GITHUB_CLASSIC),
    ("GitHub fine-grained token in a header", header(GITHUB_FINE), "GitHub", GITHUB_FINE),
    ("Slack token in a header", header(SLACK), "Slack", SLACK),
    ("JWT in a header", header(JWT), "JSON Web Token", JWT),
    ("Stripe live key in a header", header(STRIPE), "Stripe", STRIPE),
    ("Google API key in a header", header(GOOGLE), "Google", GOOGLE),
    ("private key block in a header", header(PEM.replace("\n", " ")), "private key", "MIIE"),
    # An auth scheme or a header named like a credential.
    ("Bearer scheme value", header("Bearer x"), "headers.X-Upstream", None),
    ("Basic scheme value", header("Basic dXNlcjpwYXNz"), "headers.X-Upstream", "dXNlcjpwYXNz"),
    ("Authorization header", header(PLAIN, name="Authorization"), "Authorization", PLAIN),
    ("X-Api-Key header", header(PLAIN, name="X-Api-Key"), "X-Api-Key", PLAIN),
    ("a whole header line in a value", header("Authorization: Bearer x"), "X-Upstream", None),
    # URLs: query, fragment, user information, a key's shape anywhere in them.
    ("?code= in a URL", http(url=f"{URL}?code={PLAIN}"), "code=", PLAIN),
    ("?token= in a URL", http(url=f"{URL}?x=1&token={PLAIN}"), "token=", PLAIN),
    ("#token= in a URL", http(url=f"{URL}#token={PLAIN}"), "token=", PLAIN),
    ("#access_token= in a URL", http(url=f"{URL}#access_token={PLAIN}&x=1"), "access_token", PLAIN),
    ("?password= in a URL", http(url=f"{URL}?password={PLAIN}"), "password=", PLAIN),
    ("user:pass@ in a URL", http(url=f"https://bot:{PLAIN}@agent.example/t"), "user info", PLAIN),
    ("AWS key id under ?AWSAccessKeyId=", http(url=f"{URL}?AWSAccessKeyId={AWS}"), "url", AWS),
    ("Google key under an innocent name", http(url=f"{URL}?k={GOOGLE}"), "Google", GOOGLE),
    ("JWT in a URL path", http(url=f"https://agent.example/t/{JWT}"), "url", JWT),
    (
        "#access_token= in cancel_url",
        http(cancel_url=f"{URL}#access_token={PLAIN}"),
        "cancel",
        None,
    ),
    # argv: an option and its value, together or as two items.
    ("--token VALUE as two items", command("--token", PLAIN), "argv[2]", PLAIN),
    ("--api-key VALUE as two items", command("--api-key", PLAIN), "argv[2]", PLAIN),
    ("--password VALUE as two items", command("--password", PLAIN), "argv[2]", PLAIN),
    ("-p VALUE to sshpass", command("-p", PLAIN, program="sshpass"), "argv[2]", PLAIN),
    ("-pVALUE to mysql", command("-p" + PLAIN, program="/usr/bin/mysql"), "argv[1]", PLAIN),
    ("-a VALUE to redis-cli", command("-a", PLAIN, program="redis-cli"), "argv[2]", PLAIN),
    ("--token=VALUE", command("--token=" + PLAIN), "argv[1]", PLAIN),
    ("-H 'Authorization: Bearer x'", command("-H", "Authorization: Bearer x"), "argv[2]", None),
    ("-H 'X-Api-Key: VALUE'", command("-H", f"X-Api-Key: {PLAIN}"), "argv[2]", PLAIN),
    ("a key's shape as a bare argument", command(OPENAI), "argv[1]", OPENAI),
    ("Slack token as a bare argument", command(SLACK), "argv[1]", SLACK),
    ("private key block as an argument", command(PEM), "argv[1]", "MIIE"),
    ("user:pass@ in a URL argument", command(f"postgres://app:{PLAIN}@db/x"), "argv[1]", PLAIN),
    ("?token= in a URL argument", command(f"https://h.example/?token={PLAIN}"), "argv[1]", PLAIN),
    ("curl -u user:pass", command("-u", f"bot:{PLAIN}", program="curl"), "argv[2]", PLAIN),
]


@pytest.mark.parametrize(
    ("runner", "named", "value"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_a_literal_credential_is_refused_naming_the_field_not_the_value(runner, named, value):
    problem = runner_spec.problem(runner)
    assert problem is not None, "accepted"
    assert named in problem, problem
    if value:
        assert value not in problem, problem


ACCEPTED = [
    ("named secrets", http(auth={"secret": "AGENT_TOKEN"}, headers={"X-Api-Key": {"secret": "K"}})),
    ("plain headers", http(headers={"Accept": "application/json", "X-Request-Id": "4f1c-9e"})),
    ("harmless query and fragment", http(url=f"{URL}?mode=fast&country_code=fr#section-2")),
    ("a file that holds the credential", command("--token-file", "/run/t", "--no-auth", "in.txt")),
    ("-p is a port or a flag to most programs", command("-p", "8080", "-p", "build")),
    ("ssh -p", command("-p", "22", "host", program="ssh")),
    ("words that contain sk-", command("task-abcdefghijklmnopqrstuvwxyz0123", "--disk-usage")),
    ("a header line that is not a credential", command("-H", "Accept: application/json")),
    ("a username in a URL argument", command("ssh://deploy@h.example/repo")),
    ("command env by name", {**command("run"), "env": {"OPENAI_API_KEY": {"secret": "OPENAI"}}}),
]


@pytest.mark.parametrize("runner", [a[1] for a in ACCEPTED], ids=[a[0] for a in ACCEPTED])
def test_settings_without_a_literal_credential_are_accepted(runner):
    assert runner_spec.problem(runner) is None


@pytest.mark.django_db
def test_the_api_refuses_a_two_item_token_and_stores_nothing(api, settings):
    settings.RUNNER_COMMAND_ALLOWED = ["/usr/local/bin/tool"]
    resp = api.post("/endpoints", {"address": "cred", "runner": command("--token", PLAIN)})
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"] == "invalid" and PLAIN not in resp.content.decode()
    assert not Endpoint.objects.filter(address="cred").exists()
