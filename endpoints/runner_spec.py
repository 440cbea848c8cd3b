"""The runner dict's schema: which fields each kind takes, their types, and
where a credential may appear (only as a named secret, ``core/secrets.py``).

``problem(runner)`` is the one check, pure (no DNS, no settings but the
limits): the API refuses a runner it finds fault with (400 ``invalid``
naming the field), the worker refuses to run one (a row stored before the
schema), and ``manage.py check_runners`` lists them. Messages name fields and
secrets, never a value.

- ``python``: ``path``, ``isolation`` (``process`` | ``inline``), ``kill_after_s``.
- ``command``: ``argv``, ``cwd``, ``kill_after_s``.
- ``http``: ``url``, ``cancel_url``, ``timeout_s``, ``auth: {"secret": NAME}``
  (sent as ``Authorization: Bearer <value>``), ``headers: {name: text |
  {"secret": NAME}}``.
- ``agent``: ``framework`` (``runtime.agents.ADAPTERS``), ``path``,
  ``delegate_to`` (addresses), ``history_max_messages``,
  ``history_max_bytes``, ``max_rounds``, ``secrets: {ENV_VAR: SECRET_NAME}`` (named secrets
  put into the turn's process environment: a model provider's key),
  ``side_effect_tools`` (tool names), ``kill_after_s``, ``memory``
  (``per_submitter``, the default: a submitter's turns recall only that
  submitter's exchanges; ``shared``: every submitter's).

A literal credential is refused where it can be recognised, by where it
stands or by its own shape (``literal_credential``): a header whose name says
it carries one (``Authorization``, ``Cookie``, ``X-Api-Key``, ``*token*``...)
or whose value starts with an auth scheme (``Bearer ...``) or is a whole
header line naming one; a URL with user information (``user:pass@``) or a
query or fragment parameter named like a credential (``api_key=``,
``token=``, ``#access_token=``, ``code=``...); an argv option named like one
with its value (``--token=V`` or ``--token V``, and the few programs' short
password options: ``sshpass -p V``, ``mysql -pV``, ``redis-cli -a V``,
``curl -u user:pass``); and, in any header value, URL, argv item or cwd, a
value shaped like a provider's key (``sk-...``, ``AKIA...``, ``ghp_...``,
``xoxb-...``, a JWT, a private key block...). Secrets are resolved on the
worker when the turn runs (``secret_headers``), so the runner dict, the
ledger and every screen hold names only.
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from django.conf import settings

from core.errors import Invalid
from core.limits import URL_CHARS
from core.secrets import check_name, secret

KINDS = ("python", "command", "http", "agent")
ISOLATIONS = ("process", "inline")
MEMORY_MODES = ("per_submitter", "shared")
KILL_AFTER_MAX_S = 60.0
TIMEOUT_MAX_S = 300.0
MAX_HEADERS = 20
HEADER_VALUE_CHARS = 1000

FIELDS: dict[str, frozenset[str]] = {
    "python": frozenset({"kind", "path", "isolation", "kill_after_s"}),
    "command": frozenset({"kind", "argv", "cwd", "kill_after_s", "env"}),
    "http": frozenset({"kind", "url", "cancel_url", "timeout_s", "auth", "headers"}),
    "agent": frozenset(
        {
            "kind",
            "framework",
            "path",
            "delegate_to",
            "history_max_messages",
            "history_max_bytes",
            "max_rounds",
            "secrets",
            "side_effect_tools",
            "kill_after_s",
            "memory",
        }
    ),
}

# Names that say "this carries a credential": a header, a query parameter or
# an argv option so named must not hold a literal value. Words that rarely
# mean anything else match anywhere (``accessToken``, ``X-Amz-Signature``);
# short ones only as a whole word (``key=``, not ``monkey=``).
_CREDENTIAL_ANYWHERE = re.compile(
    r"token|secret|passw|api[_-]?key|access[_-]?key|signature|credential|cookie|jwt|bearer|authoriz",
    re.IGNORECASE,
)
_CREDENTIAL_WORD = re.compile(
    r"(?:^|[^a-z0-9])(?:key|sig|auth|session|sessionid|pwd|pass)(?:$|[^a-z0-9])", re.IGNORECASE
)


# framework name (an agent runner's ``framework``) -> the module holding its
# ADAPTER (runtime/agents/), imported by the runtime when a turn runs one.
AGENT_ADAPTERS = {
    "pydantic_ai": "runtime.agents.pydanticai",
    "openai_agents": "runtime.agents.openaiagents",
    "langgraph": "runtime.agents.langgraphs",
}


def names_credential(name: str) -> bool:
    return bool(_CREDENTIAL_ANYWHERE.search(name) or _CREDENTIAL_WORD.search(name))


_AUTH_SCHEME = re.compile(r"^\s*(?:bearer|basic|token|digest|negotiate|apikey)\s", re.IGNORECASE)
# A URL parameter that is a credential although its name is ordinary: an
# OAuth authorization code.
_URL_CREDENTIAL_PARAMS = frozenset({"code"})
# An option named like a credential that names where one is, not the value.
_NAMES_A_PLACE = re.compile(r"^no[-_]|[-_](?:file|path|dir|env|var|name|id|type|url|header)$", re.I)
_ARGV_FLAG = re.compile(r"^--?([A-Za-z][A-Za-z0-9_.-]*)$")
# Short options that take a password in the programs that have them
# (elsewhere ``-p`` is a port or a flag: ``ssh -p 22``, ``mkdir -p``).
_PASSWORD_OPTIONS = {
    "-p": frozenset(
        {"sshpass", "mysql", "mysqldump", "mysqladmin", "mysqlimport", "mariadb", "mariadb-dump"}
    ),
    "-a": frozenset({"redis-cli", "valkey-cli", "keydb-cli"}),
}
_USER_PASSWORD_OPTIONS = {"-u": frozenset({"curl"}), "--user": frozenset({"curl"})}
_HEADER_LINE = re.compile(r"^\s*([A-Za-z0-9_-]{1,100})\s*:\s*(\S.*)$", re.DOTALL)

# Values whose shape says what they are, wherever they stand: the providers'
# published key formats, as secret scanners (detect-secrets' plugins, GitHub
# secret scanning) recognise them. Each names a kind for the refusal, never
# the value.
_KEY_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("an OpenAI or Anthropic API key (sk-...)", r"(?<![\w-])sk-[A-Za-z0-9_-]{20,}"),
        ("a Stripe secret key", r"(?<![A-Za-z0-9])[rs]k_(?:live|test)_[0-9A-Za-z]{16,}"),
        ("an AWS access key id", r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[0-9A-Z]{16}"),
        ("a GitHub token", r"(?<![A-Za-z0-9])(?:gh[pousr]_[A-Za-z0-9]{36}|github_pat_\w{22,})"),
        ("a GitLab token", r"(?<![A-Za-z0-9])gl(?:pat|dt|ft|rt|cbt|oas)-[A-Za-z0-9_-]{20,}"),
        ("a Slack token", r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9-]{10,}"),
        ("a Slack webhook URL", r"hooks\.slack\.com/services/T[A-Za-z0-9_]+/B[A-Za-z0-9_]+/\w+"),
        ("a Google API key", r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_-]{35}"),
        ("a JSON Web Token", r"(?<![A-Za-z0-9])eyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]*"),
        ("a private key", r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|PuTTY-User-Key-"),
        ("a SendGrid API key", r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}"),
        ("an npm token", r"(?<![A-Za-z0-9])npm_[A-Za-z0-9]{36}"),
        ("a PyPI token", r"pypi-AgE[A-Za-z0-9_-]{50,}"),
        ("a Hugging Face token", r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{34}"),
    )
)


def literal_credential(text: str) -> str | None:
    """What kind of credential ``text`` visibly holds, or None: a key's
    shape anywhere in it, an auth scheme or a header line naming a
    credential, a URL with a password or a credential parameter."""
    for kind, shape in _KEY_SHAPES:
        if shape.search(text):
            return kind
    if _AUTH_SCHEME.match(text):
        return "an Authorization value (a scheme and its credential)"
    line = _HEADER_LINE.match(text)
    if line and (names_credential(line.group(1)) or _AUTH_SCHEME.match(line.group(2))):
        return f"a header line {line.group(1)[:100]}: with a credential"
    if "://" in text:
        return _url_credential(text)
    return None


_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")


def _url_credential(text: str) -> str | None:
    for url in _URL_IN_TEXT.findall(text):
        try:
            parts = urlsplit(url)
            password = parts.password
        except ValueError:
            continue
        if password:
            return "a URL with user information (user:password@)"
        name = _credential_param(parts)
        if name:
            return f"a URL with a credential parameter ({name}=)"
    return None


def _credential_param(parts: Any) -> str | None:
    """The first query or fragment parameter of a split URL named like a
    credential (a fragment is never sent, but it is stored all the same)."""
    for params in (parts.query, parts.fragment):
        for name, _ in parse_qsl(params, keep_blank_values=True):
            if names_credential(name) or name.lower() in _URL_CREDENTIAL_PARAMS:
                return name[:100]
    return None


_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")
# Headers the runner sets itself: a runner may not replace them.
_RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "traceparent",
        "tracestate",
    }
)
_ARGV_OPTION = re.compile(r"^-{0,2}([A-Za-z0-9_.-]+)=(.+)$", re.DOTALL)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _secret_ref(value: Any, where: str) -> str:
    """``{"secret": NAME}`` -> NAME; anything else is a problem naming ``where``."""
    if not isinstance(value, dict) or set(value) != {"secret"}:
        raise Invalid(f'{where} must be {{"secret": NAME}}')
    try:
        return check_name(value["secret"])
    except Invalid as exc:
        raise Invalid(f"{where}: {exc.detail}") from None


def _check_url(key: str, url: Any, *, required: bool) -> None:
    if url is None and not required:
        return
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise Invalid(f"an http runner needs {key}: an http(s) URL")
    if len(url) > URL_CHARS:
        raise Invalid(f"http runner {key} is over {URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        has_userinfo = parts.username is not None or parts.password is not None
    except ValueError:
        raise Invalid(f"http runner {key} is not a valid URL") from None
    if has_userinfo or "@" in parts.netloc:
        raise Invalid(
            f"http runner {key} carries user information (user:password@): "
            'send credentials as a named secret ("auth": {"secret": NAME})'
        )
    name = _credential_param(parts)
    if name:
        raise Invalid(
            f"http runner {key} has a credential in its query string or fragment ({name}=): "
            "send it in a header that names a secret "
            '("headers": {"X-Api-Key": {"secret": NAME}})'
        )
    _refuse_literal(f"http runner {key}", url)


def _refuse_literal(where: str, text: str) -> None:
    kind = literal_credential(text)
    if kind:
        raise Invalid(
            f'{where} holds what looks like {kind}: name a secret instead ({{"secret": NAME}}, '
            "resolved on the worker host)"
        )


def _check_headers(headers: Any, *, with_auth: bool) -> None:
    if not isinstance(headers, dict):
        raise Invalid("http runner headers must be an object of header name to value")
    if len(headers) > MAX_HEADERS:
        raise Invalid(f"http runner headers: at most {MAX_HEADERS}")
    for name, value in headers.items():
        where = f"http runner headers.{name}"
        if not _HEADER_NAME.match(name):
            raise Invalid(f"http runner header name {name[:100]!r} is not a valid header name")
        if name.lower() in _RESERVED_HEADERS:
            raise Invalid(f"{where} is set by the runner itself")
        if name.lower() == "authorization" and with_auth:
            raise Invalid(f"{where} and auth both set the Authorization header")
        if isinstance(value, dict):
            _secret_ref(value, where)
            continue
        if not isinstance(value, str) or len(value) > HEADER_VALUE_CHARS:
            raise Invalid(
                f'{where} must be text (at most {HEADER_VALUE_CHARS}) or {{"secret": NAME}}'
            )
        if "\r" in value or "\n" in value or not value.isprintable():
            raise Invalid(f"{where} must be printable text on one line")
        if names_credential(name) or _AUTH_SCHEME.match(value):
            raise Invalid(
                f'{where} looks like a credential: name a secret instead ({{"secret": NAME}}, '
                "resolved on the worker host)"
            )
        _refuse_literal(where, value)


def _check_argv(argv: Any) -> None:
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise Invalid("a command runner needs argv: a non-empty list of strings")
    program = os.path.basename(argv[0])
    for i, item in enumerate(argv):
        option = _ARGV_OPTION.match(item)
        if option and _option_takes_credential(option.group(1)):
            raise Invalid(
                f"command runner argv[{i}] passes a credential ({option.group(1)}=) "
                "on the command line: commands get no literal credentials"
            )
        if i and _takes_credential(program, argv[i - 1], item):
            raise Invalid(
                f"command runner argv[{i}] is the value of {argv[i - 1]}, a credential "
                "on the command line: commands get no literal credentials "
                '(pass one through env: {"NAME": {"secret": SECRET_NAME}})'
            )
        for short, programs in _PASSWORD_OPTIONS.items():
            if program in programs and item.startswith(short) and len(item) > len(short):
                raise Invalid(f"command runner argv[{i}] passes a password to {program}")
        _refuse_literal(f"command runner argv[{i}]", item)


def _option_takes_credential(name: str) -> bool:
    return names_credential(name) and not _NAMES_A_PLACE.search(name)


def _takes_credential(program: str, previous: str, item: str) -> bool:
    """Whether ``item``, following ``previous``, is a credential's value:
    ``--token V``, ``--api-key V``, or a program's own password option."""
    if item.startswith("-"):
        return False
    flag = _ARGV_FLAG.match(previous)
    if flag and _option_takes_credential(flag.group(1)):
        return True
    if program in _USER_PASSWORD_OPTIONS.get(previous, ()):
        return ":" in item  # user:password; a user alone makes curl prompt
    return program in _PASSWORD_OPTIONS.get(previous, ())


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v for v in value)


def _check_agent(runner: dict[str, Any]) -> None:
    if runner.get("framework") not in AGENT_ADAPTERS:
        raise Invalid(f"an agent runner needs framework: one of {', '.join(AGENT_ADAPTERS)}")
    path = runner.get("path")
    if not isinstance(path, str) or not re.fullmatch(r"[\w.]+\.[\w]+", path or ""):
        raise Invalid("an agent runner needs path: a dotted path to an agent or a factory")
    if "delegate_to" in runner and not _str_list(runner["delegate_to"]):
        raise Invalid("delegate_to must be a list of endpoint addresses")
    if "side_effect_tools" in runner and not _str_list(runner["side_effect_tools"]):
        raise Invalid("side_effect_tools must be a list of tool names")
    for name in ("history_max_messages", "history_max_bytes", "max_rounds"):
        value = runner.get(name)
        if name in runner and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise Invalid(f"{name} must be a positive integer")
    if "memory" in runner and runner["memory"] not in MEMORY_MODES:
        raise Invalid(f"an agent runner's memory must be one of {', '.join(MEMORY_MODES)}")
    if "secrets" in runner:
        named = runner["secrets"]
        if not isinstance(named, dict):
            raise Invalid("agent runner secrets must map environment variable names to secrets")
        for env_name, secret_name in named.items():
            if not isinstance(env_name, str) or not _ENV_NAME.match(env_name):
                raise Invalid(
                    f"agent runner secrets: {str(env_name)[:100]!r} is not a variable name"
                )
            try:
                check_name(secret_name)
            except Invalid as exc:
                raise Invalid(f"agent runner secrets.{env_name}: {exc.detail}") from None


def check(runner: Any) -> None:
    """Raise ``Invalid`` naming the first field at fault; return if none."""
    if not isinstance(runner, dict):
        raise Invalid("runner must be an object with a kind")
    kind = runner.get("kind")
    if not isinstance(kind, str) or kind not in FIELDS:
        raise Invalid(f"runner kind must be one of {', '.join(KINDS)}")
    unknown = sorted(str(k) for k in set(runner) - FIELDS[kind])
    if unknown:
        raise Invalid(
            f"a {kind} runner has no field {', '.join(unknown)} "
            f"(it takes {', '.join(sorted(FIELDS[kind] - {'kind'}))})"
        )
    if "kill_after_s" in runner:
        value = runner["kill_after_s"]
        if not _is_number(value) or not 0 < value <= KILL_AFTER_MAX_S:
            raise Invalid(
                f"kill_after_s must be a number of seconds above 0 and at most {KILL_AFTER_MAX_S:g}"
            )
    if kind == "python":
        path = runner.get("path")
        if not isinstance(path, str) or not re.fullmatch(r"[\w.]+\.[\w]+", path or ""):
            raise Invalid("a python runner needs path: a dotted path to a callable")
        if "isolation" in runner and runner["isolation"] not in ISOLATIONS:
            raise Invalid(f"isolation must be one of {', '.join(ISOLATIONS)}")
    elif kind == "command":
        _check_argv(runner.get("argv"))
        if "cwd" in runner and not (isinstance(runner["cwd"], str) and runner["cwd"]):
            raise Invalid("a command runner's cwd must be a directory path")
        if "cwd" in runner:
            _refuse_literal("command runner cwd", runner["cwd"])
        _check_command_env(runner.get("env"))
    elif kind == "agent":
        _check_agent(runner)
    else:
        _check_url("url", runner.get("url"), required=True)
        _check_url("cancel_url", runner.get("cancel_url"), required=False)
        if "timeout_s" in runner and not (
            _is_number(runner["timeout_s"]) and 0 < runner["timeout_s"] <= TIMEOUT_MAX_S
        ):
            raise Invalid(
                f"timeout_s must be a number of seconds above 0 and at most {TIMEOUT_MAX_S:g}"
            )
        if "auth" in runner:
            _secret_ref(runner["auth"], "http runner auth")
        if "headers" in runner:
            _check_headers(runner["headers"], with_auth="auth" in runner)


def problem(runner: Any) -> str | None:
    """What is wrong with a runner dict (``check``), or None."""
    try:
        check(runner)
    except Invalid as exc:
        return exc.detail
    return None


def secret_headers(runner: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The http runner's configured headers with their secrets resolved on
    this host, and ``{value: secret name}`` of the values resolved (for
    redacting them from anything the agent sends back). Raises
    ``core.secrets.SecretMissing`` naming a secret this host lacks."""
    headers: dict[str, str] = {}
    resolved: dict[str, str] = {}
    for name, value in (runner.get("headers") or {}).items():
        if isinstance(value, dict):
            headers[name] = secret(value["secret"])
            resolved[headers[name]] = value["secret"]
        else:
            headers[name] = value
    auth = runner.get("auth")
    if auth:
        value = secret(auth["secret"])
        headers["Authorization"] = f"Bearer {value}"
        resolved[value] = auth["secret"]
    return headers, resolved


def public_view(runner: dict[str, Any]) -> dict[str, Any]:
    """What a caller who neither owns the endpoint nor is staff sees of its
    runner: the kind, nothing of its settings."""
    return {"kind": runner.get("kind", "")} if isinstance(runner, dict) else {}


# What a command's process inherits from the worker: enough to run a program,
# nothing that opens the ledger (DATABASE_URL, SECRET_KEY, the signing secret).
COMMAND_BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def _check_command_env(env: object) -> None:
    """``env``: ``{NAME: {"secret": SECRET_NAME}}``, the only way a command
    gets a credential (a literal value would sit in the runner dict)."""
    if env is None:
        return
    if not isinstance(env, dict) or len(env) > MAX_HEADERS:
        raise Invalid(f"a command runner's env is an object of at most {MAX_HEADERS} names")
    for name, ref in env.items():
        if not _ENV_NAME.match(name):
            raise Invalid("a command runner's env names are letters, digits and _")
        _secret_ref(ref, f"command runner env.{name}")


def command_env(runner: dict, base: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The environment a command runs with (the few names of ``base`` in
    ``COMMAND_BASE_ENV`` and the runner's secrets, resolved on this host),
    and ``{value: secret name}`` of the secrets, for redacting them from
    what the command prints. Raises ``SecretMissing`` as ``secret_headers``."""
    env = {k: base[k] for k in COMMAND_BASE_ENV if k in base}
    resolved: dict[str, str] = {}
    for name, ref in (runner.get("env") or {}).items():
        env[name] = secret(ref["secret"])
        resolved[env[name]] = ref["secret"]
    return env, resolved


def named_secrets(runner: dict[str, Any]) -> list[str]:
    """The secrets a process-isolated turn of this runner resolves itself
    (an agent's ``secrets``): its supervisor hands it these and no others
    when it runs as the runner user."""
    if runner.get("kind") != "agent":
        return []
    named = runner.get("secrets") or {}
    return [str(v) for v in named.values()] if isinstance(named, dict) else []


def memory_mode(runner: dict[str, Any]) -> str | None:
    """An agent runner's memory (``MEMORY_MODES``); None for other kinds."""
    if not isinstance(runner, dict) or runner.get("kind") != "agent":
        return None
    return runner.get("memory") or MEMORY_MODES[0]


def runs_isolated(runner: dict[str, Any]) -> bool:
    """Whether this runner's turns run in a turn process of their worker
    slot (a python runner unless ``inline``; an agent always), not in the
    pool process itself."""
    kind = runner.get("kind")
    return kind == "agent" or (kind == "python" and runner.get("isolation") != ISOLATIONS[1])


def _inside(path: str, prefix: str) -> bool:
    """``path`` lies inside the package or module ``prefix`` names
    ("runtime.demo." and "runtime.demo" both allow runtime.demo.echo,
    neither allows runtime.demonic.x)."""
    base = prefix.strip().rstrip(".")
    return bool(base) and path.startswith(base + ".")


def not_allowed(runner: dict[str, Any]) -> str | None:
    """Why the operator's allow-list refuses this python or command runner,
    or None. Staff configure endpoints, but what code may run on the workers
    is the operator's decision (settings): RUNNER_PYTHON_ALLOWED_PREFIXES for
    a python path, RUNNER_COMMAND_ALLOWED for a command's executable (argv[0],
    compared exactly: a name looked up on PATH is only as safe as PATH). http
    runners are checked against the URL policy where they are configured."""
    kind = runner.get("kind")
    if kind in ("python", "agent"):  # an agent's path is a python path too
        path = str(runner.get("path", ""))
        prefixes = list(settings.RUNNER_PYTHON_ALLOWED_PREFIXES or [])
        if not any(_inside(path, p) for p in prefixes):
            return (
                f"{kind} runner path {path!r} is not allowed: RUNNER_PYTHON_ALLOWED_PREFIXES "
                f"allows {', '.join(prefixes) or 'nothing'}"
            )
    elif kind == "command":
        argv = runner.get("argv") or [""]
        allowed = list(settings.RUNNER_COMMAND_ALLOWED or [])
        if str(argv[0]) not in allowed:
            return (
                f"command runner executable {argv[0]!r} is not allowed: RUNNER_COMMAND_ALLOWED "
                f"allows {', '.join(allowed) or 'nothing'}"
            )
    return None
