"""The project's URLconf plus the framework floor of bench/http.py, mounted
only in the gunicorn that benchmark starts (``bench.http_settings``).

``POST /bench/floor``: a django-ninja route that parses the same body as
``POST /api/v1/tickets`` into a schema and inserts one row (autocommit, one
round trip), through the same middleware stack: what any admission route on
this framework costs. ``POST /bench/floor-auth``: the same behind the
project's bearer-key auth (one more query), to split the difference.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import connection
from django.urls import path
from ninja import NinjaAPI, Schema

from accounts.auth import ApiKeyAuth
from config.urls import urlpatterns as project_urlpatterns
from core.ids import new_id

floor_api = NinjaAPI(
    title="bench floor", version="bench", urls_namespace="bench_floor", docs_url=None
)

FLOOR_TABLE = "bench_http_floor"


class FloorIn(Schema):
    endpoint: str
    dedupe_key: str | None = None
    input: dict[str, Any]


class FloorOut(Schema):
    id: str
    endpoint: str
    dedupe_key: str | None


def _insert(payload: FloorIn) -> dict:
    row_id = new_id()
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {FLOOR_TABLE} (id, k, v) VALUES (%s, %s, %s::jsonb)",
            [row_id, payload.dedupe_key, json.dumps(payload.input)],
        )
    return {"id": str(row_id), "endpoint": payload.endpoint, "dedupe_key": payload.dedupe_key}


@floor_api.post("/floor", response={201: FloorOut}, auth=None)
def floor(request, payload: FloorIn):
    return 201, _insert(payload)


@floor_api.post("/floor-auth", response={201: FloorOut}, auth=ApiKeyAuth())
def floor_auth(request, payload: FloorIn):
    return 201, _insert(payload)


urlpatterns = [path("bench/", floor_api.urls), *project_urlpatterns]
