"""The outbound URL policy and pinned sending, for every call the server
makes to a URL someone gave it: a requester's webhook (tickets.delivery) and
an http agent (runtime.runners). Both apps import it from here, so neither
imports the other for it.

The policy (``resolve_target``): http(s) with a host; ``DELIVERY_ALLOWED_HOSTS``
not empty means only listed hosts; an unlisted host must resolve to public
addresses only (a server-side request forgery guard). A URL is checked when
it is given (``validate_outbound_url``) and again at send time, and the send
connects only to the addresses that check accepted (``post_pinned``): the
host is never resolved again between the check and the connection, which
closes the DNS-rebinding window.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx
from django.conf import settings

from core.errors import Invalid

# --- The policy ---------------------------------------------------------------------------


def host_listed(host: str, allowed: list[str]) -> bool:
    """Exact host (case-insensitive), or ``.example.com`` for a domain and its
    subdomains, as in Django's ALLOWED_HOSTS."""
    host = host.lower().rstrip(".")
    for entry in allowed:
        entry = entry.strip().lower().rstrip(".")
        if not entry:
            continue
        if entry.startswith("."):
            if host == entry[1:] or host.endswith(entry):
                return True
        elif host == entry.strip("[]"):
            return True
    return False


# IPv6 forms that carry an IPv4 address (core/outbound.py ``is_public``).
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052 well-known prefix
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215 local use
_TEREDO = ipaddress.ip_network("2001::/32")


def is_public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """A global unicast address, and so is any IPv4 address it carries.

    IPv6 has forms that reach an IPv4 address through a translator or a
    tunnel; each is judged by the IPv4 address inside:

    - ``::ffff:a.b.c.d`` (IPv4-mapped): the address itself.
    - ``64:ff9b::a.b.c.d`` (NAT64, well-known prefix): a NAT64 gateway
      connects to a.b.c.d, so it is public exactly when a.b.c.d is.
      The local-use NAT64 prefix ``64:ff9b:1::/48`` is refused outright.
    - ``2002:aabb:ccdd::/48`` (6to4): the relay delivers to aa.bb.cc.dd, so
      that must be public as well as the IPv6 address.
    - ``2001::/32`` (Teredo): refused outright. It names a tunnel server and
      an obfuscated client address; no webhook or agent needs one, and the
      client part can be any IPv4 address behind a NAT.

    Decided here rather than left to ``ipaddress``'s special-purpose tables,
    which differ between Python releases.
    """
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return is_public(ip.ipv4_mapped)  # ::ffff:127.0.0.1 is loopback too
        if ip in _TEREDO or ip in _NAT64_LOCAL:
            return False
        if ip in _NAT64:
            return is_public(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if ip.sixtofour is not None and not is_public(ip.sixtofour):
            return False
    return ip.is_global and not (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_reserved
        or ip.is_multicast
        or ip.is_unspecified
    )


class Unresolvable(Invalid):
    """The webhook host does not resolve (now): refused at admission, but
    at send time a failed attempt to retry, since DNS may come back."""


@dataclass(frozen=True)
class Target:
    """Where a webhook goes: the URL's host, and the addresses it resolved
    to and that passed the policy. A send connects to these, never to a new
    resolution of the host."""

    host: str
    port: int
    addresses: tuple[str, ...]


def resolve_target(url: str, *, resolve_listed: bool = True, label: str = "webhook") -> Target:
    """Check an outbound URL (a webhook, an http agent's) against the policy;
    raise ``Invalid`` saying why not (``label`` names the URL in the message).

    1. ``http`` or ``https`` with a host (and a valid port).
    2. ``DELIVERY_ALLOWED_HOSTS`` not empty: the host must be listed. A listed
       host is trusted as it is, private or loopback included.
    3. Resolve the host once (``Unresolvable`` if it does not resolve). An
       unlisted host must resolve to public addresses only: no private,
       loopback, link-local, reserved, multicast or unspecified address (a
       server-side request forgery guard), every address checked.

    ``resolve_listed=False`` (admission) skips resolving a listed host: it
    is trusted as named, and only a send needs its addresses.
    """
    if not isinstance(url, str) or not url:
        raise Invalid(f"{label}_url must be an http(s) URL")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise Invalid(f"{label}_url is not a valid URL") from None
    if parts.scheme not in ("http", "https"):
        raise Invalid(f"{label}_url must use http or https")
    host = parts.hostname
    if not host:
        raise Invalid(f"{label}_url has no host")
    port = port or (443 if parts.scheme == "https" else 80)
    allowed: list[str] = list(settings.DELIVERY_ALLOWED_HOSTS or [])
    listed = host_listed(host, allowed)
    if allowed and not listed:
        raise Invalid(f"{label} host {host!r} is not in DELIVERY_ALLOWED_HOSTS")
    if listed and not resolve_listed:
        return Target(host=host, port=port, addresses=())
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError, OSError):
        raise Unresolvable(f"{label} host {host!r} does not resolve") from None
    addresses = tuple(dict.fromkeys(info[4][0].split("%", 1)[0] for info in infos))
    if not addresses:
        raise Unresolvable(f"{label} host {host!r} does not resolve")
    for address in addresses:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            raise Invalid(f"{label} host {host!r} resolves to an unusable address") from None
        if not listed and not is_public(ip):
            raise Invalid(
                f"{label} host {host!r} resolves to {ip}, which is not a public address; "
                "list the host in DELIVERY_ALLOWED_HOSTS to allow it"
            )
    return Target(host=host, port=port, addresses=addresses)


def validate_outbound_url(url: str, *, label: str = "webhook") -> None:
    """Refuse, when it is given (admission, an endpoint's runner), a target we
    must not call (``resolve_target``); the send checks it again."""
    resolve_target(url, resolve_listed=False, label=label)


class PinnedBackend(httpcore.NetworkBackend):
    """httpcore's network backend for one send: it connects to the checked
    addresses, in order, whatever host it is asked for, so the host is never
    resolved again between the check and the connection (a DNS-rebinding
    window: a second answer could name an internal address). The request
    keeps the URL's host for its Host header, TLS SNI and certificate check
    (httpcore takes those from the URL, not from the connected address)."""

    def __init__(self, addresses: tuple[str, ...]) -> None:
        self.addresses = addresses
        self.backend = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        refused: httpcore.ConnectError | None = None
        for address in self.addresses:
            try:
                return self.backend.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except httpcore.ConnectError as exc:  # refused or unreachable: the next address
                refused = exc
        raise refused or httpcore.ConnectError("no address to connect to")

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise httpcore.ConnectError("an outbound call never goes to a unix socket")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@functools.lru_cache(maxsize=4)
def _verifying_context(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    # httpx's own (certifi's bundle, or SSL_CERT_FILE / SSL_CERT_DIR, which
    # it reads): the arguments only key the cache.
    return httpx.create_ssl_context()


def tls_context() -> ssl.SSLContext:
    """The verifying TLS context of every outbound call, one per process and
    CA setting: building one loads the CA bundle, which
    per call would be most of a webhook attempt's worker CPU (bench/costs.py).
    A context is safe to share between threads and connections once
    configured, and nothing here configures it after."""
    return _verifying_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


class PinnedTransport(httpx.HTTPTransport):
    """httpx's transport with its connection pool on ``PinnedBackend``.
    httpx takes no network backend of its own; httpcore's pool does."""

    def __init__(self, target: Target) -> None:
        context = tls_context()
        super().__init__(verify=context)  # no context of its own to build
        self._pool = httpcore.ConnectionPool(
            ssl_context=context,
            max_connections=1,
            network_backend=PinnedBackend(target.addresses),
        )


def post_pinned(
    *,
    url: str,
    target: Target,
    body: bytes | None = None,
    json: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float | None = None,
) -> httpx.Response:
    """POST to ``url`` over a connection to ``target``'s checked addresses.
    No redirect is followed (a 3xx is the answer: it could point anywhere),
    and no proxy or netrc from the environment applies (``trust_env``: a
    proxy would resolve the host itself)."""
    with httpx.Client(
        transport=PinnedTransport(target),
        timeout=settings.DELIVERY_TIMEOUT_S if timeout is None else timeout,
        follow_redirects=False,
        trust_env=False,
    ) as client:
        return client.post(url, content=body, json=json, headers=headers)
