"""Settings of the gunicorn that bench/http.py starts: the project's own,
with the bench-only URLconf that adds the framework floor routes."""

from config.settings import *  # noqa: F403

ROOT_URLCONF = "bench.http_urls"
