"""Live regions that wake on a notification, not on a timer.

A live region of a console page carries a change token (``{% live %}``:
a ticket's newest event, or the ledger's newest event for lists
and the dashboard). console.js asks ``GET /console/live/?token=…`` (with
``ticket=<id>`` for one ticket) and the request waits, woken by the NOTIFY
every ticket event sends at commit (tickets/waits.py), for up to
``CONSOLE_LIVE_WAIT_S``. It answers ``{"live": true, "changed": …,
"token": …}``; on ``changed`` the page refreshes the region (at most every
``data-live-min`` seconds) and watches again from the new token. A waiting
watch costs no query and holds no database session, only a thread: at most
``CONSOLE_LIVE_SLOTS`` per process, so the other threads keep serving.

``{"live": false, "retry_s": …}`` (the listener down, no slot free, live regions off)
sends the page back to polling on the region's own period until then. A
60-second timer stays on every region regardless, for what no event marks
(an obligation falling overdue, a worker's heartbeat going stale).

Who may watch what: a console user, and for ``ticket=`` only a ticket they
may see (404 otherwise, exactly as for an unknown id). A watch of the
ledger wakes on any ticket's event and so tells its user that something
changed, not what; the region they then refresh shows only what they may
see.
"""

from __future__ import annotations

import threading

from django.conf import settings
from django.http import JsonResponse
from django.views.decorators.http import require_GET

from tickets import waits

from ..selectors import live as selectors

TOKEN_MAX = 64
_slots_lock = threading.Lock()
_slots: threading.BoundedSemaphore | None = None
_slots_size = 0


def _slot() -> threading.BoundedSemaphore:
    global _slots, _slots_size  # noqa: PLW0603 - one semaphore per process, sized by settings
    size = settings.CONSOLE_LIVE_SLOTS
    with _slots_lock:
        if _slots is None or _slots_size != size:  # tests change the setting
            _slots, _slots_size = threading.BoundedSemaphore(size), size
        return _slots


def _answer(status: int = 200, **body) -> JsonResponse:
    response = JsonResponse(body, status=status)
    response["Cache-Control"] = "no-store"
    return response


@require_GET
def watch(request):
    if not request.user.is_authenticated:
        return _answer(401, error="unauthenticated", detail="Log in again.")
    token = request.GET.get("token", "")[:TOKEN_MAX]
    key, read = selectors.watched(request.GET.get("ticket"), user=request.user)
    if settings.CONSOLE_LIVE_SLOTS <= 0:
        return _answer(live=False, retry_s=None)
    slots = _slot()
    if not slots.acquire(blocking=False):
        return _answer(live=False, retry_s=30)
    try:
        outcome = waits.wait_for_change(key, token, read, settings.CONSOLE_LIVE_WAIT_S)
    finally:
        slots.release()
    if outcome is None:  # a listener that is down comes back
        return _answer(live=False, retry_s=10)
    current, changed = outcome
    return _answer(live=True, changed=changed, token=current)
