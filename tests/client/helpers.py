"""Test helpers without Django: a tiny HTTP-aware TCP proxy on 127.0.0.1 in
front of the live server (the faults a client meets between itself and the
server), a recording HTTP server (an agent, a webhook receiver), ``poll``."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass

from tests.waiting import wait_for


@dataclass
class Seen:
    at: float
    action: str
    method: str
    path: str
    body: bytes


def _read_request(conn: socket.socket) -> bytes | None:
    """One HTTP/1.1 request (headers and a Content-Length body), or None
    when the client closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head + b"\r\n\r\n" + body


def _closing(message: bytes) -> bytes:
    """The same HTTP message with ``Connection: close``. On the request: the
    upstream closes after its answer, so the answer ends at EOF. On the
    answer: the client knows this proxy closes too and never reuses the
    connection (a reused, closed connection would be a fault of our own)."""
    head, _, body = message.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body


class Proxy:
    """Forwards each request to ``upstream`` on a connection of its own.

    ``plan`` gives the action for the first requests, in order; later ones
    are forwarded. Actions:

    - ``"forward"``: pass the request and the whole answer.
    - ``"drop"``: pass the request, wait for the server's complete answer
      (so the server has done the work and committed), then close the
      client's connection without a byte of it: the client sees a dropped
      connection, as if the network failed on the way back.
    - ``"503"``: answer 503 ``unavailable`` with ``Retry-After`` itself,
      never reaching the server.
    """

    def __init__(self, upstream: tuple[str, int], plan: list[str], retry_after: str = "1"):
        self.upstream = upstream
        self.plan = list(plan)
        self.retry_after = retry_after
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def close(self) -> None:
        self._closed = True
        # close() alone does not wake a thread blocked in accept() on Linux:
        # the join below waited out its 5 s after every test. shutdown() does.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)
        assert not self._thread.is_alive(), "the proxy's accept loop did not stop"

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(90)
            request = _read_request(conn)
            if request is None:
                return
            request_line = request.split(b"\r\n", 1)[0].decode()
            method, path, _ = request_line.split(" ", 2)
            with self._lock:
                action = self.plan.pop(0) if self.plan else "forward"
                self.seen.append(
                    Seen(
                        at=time.monotonic(),
                        action=action,
                        method=method,
                        path=path,
                        body=request.partition(b"\r\n\r\n")[2],
                    )
                )
            if action == "503":
                body = b'{"error": "unavailable", "detail": "the database is briefly unreachable"}'
                conn.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\n"
                    b"Content-Type: application/json\r\n"
                    + f"Retry-After: {self.retry_after}\r\n".encode()
                    + f"Content-Length: {len(body)}\r\n".encode()
                    + b"Connection: close\r\n\r\n"
                    + body
                )
                return
            answer = b""
            with socket.create_connection(self.upstream, timeout=90) as up:
                up.sendall(_closing(request))
                while chunk := up.recv(65536):
                    answer += chunk
            if action == "drop":
                return  # closing ``conn`` unanswered: the client's request is lost on the way back
            conn.sendall(_closing(answer))


# The suite's one wait helper, under the name these tests know.
poll = wait_for


class Recorder:
    """A local HTTP server (an http-runner agent or a webhook receiver): it
    records each POST's path, headers and raw body and answers ``status``
    (with ``reply`` as a JSON body)."""

    def __init__(self, status: int = 202, reply: bytes = b"") -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                recorder.requests.append((self.path, dict(self.headers.items()), body))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def bodies(self, path: str) -> list[bytes]:
        return [body for p, _, body in self.requests if p == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
