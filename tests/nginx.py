"""nginx with the project's own site configuration (deploy/nginx.conf) in
front of a gunicorn of a test's (or a benchmark's): the configuration is
taken as deployed, with only its listen address and upstream port moved to
free ports, inside a minimal main configuration of its own (temp files and
pid under a private directory)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "deploy" / "nginx.conf"


def available() -> bool:
    return shutil.which("nginx") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render_site(*, listen: int, upstream: int) -> str:
    site = SITE.read_text()
    for deployed, here in (
        ("server 127.0.0.1:8000;", f"server 127.0.0.1:{upstream};"),
        ("listen 80;", f"listen 127.0.0.1:{listen};"),
    ):
        assert deployed in site, f"deploy/nginx.conf no longer has {deployed!r}"
        site = site.replace(deployed, here)
    return site


class Nginx:
    """``with Nginx(upstream=port) as proxy: proxy.port``"""

    def __init__(self, *, upstream: int, directory: Path) -> None:
        self.upstream = upstream
        self.dir = directory
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Nginx:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "claimcheck.conf").write_text(
            render_site(listen=self.port, upstream=self.upstream)
        )
        temp = {name: self.dir / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
        for path in temp.values():
            path.mkdir(exist_ok=True)
        # As root nginx's workers would run as nobody, who cannot write the
        # private temp directories: they stay this user.
        user = "user root;" if os.geteuid() == 0 else ""
        (self.dir / "nginx.conf").write_text(
            f"""{user}
daemon off;
worker_processes 1;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {temp["body"]};
    proxy_temp_path {temp["proxy"]};
    fastcgi_temp_path {temp["fastcgi"]};
    uwsgi_temp_path {temp["uwsgi"]};
    scgi_temp_path {temp["scgi"]};
    include {self.dir}/claimcheck.conf;
}}
"""
        )
        conf = str(self.dir / "nginx.conf")
        check = subprocess.run(
            ["nginx", "-t", "-p", str(self.dir), "-c", conf, "-e", str(self.dir / "error.log")],
            capture_output=True,
            text=True,
        )
        assert check.returncode == 0, check.stderr
        self.proc = subprocess.Popen(
            ["nginx", "-p", str(self.dir), "-c", conf, "-e", str(self.dir / "error.log")],
            start_new_session=True,
        )

        def listening() -> bool:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return True
            assert self.proc.poll() is None, (self.dir / "error.log").read_text()
            return False

        wait_for(listening, timeout=20, message="nginx to listen")
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGQUIT)  # graceful: finish, then exit
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
