"""Text caps, one source: the API's schemas, the services that check them
again (for callers that are not the API: the console, commands, the
runtime), the console's forms and the database columns read them here, so a
caller never meets one cap in a form and another behind it.

The API answers a text over its cap 422 ``invalid`` naming the field."""

from __future__ import annotations

# An endpoint address or alias (a slug); a requester's name.
ADDRESS_CHARS = 200
NAME_CHARS = 200
# A webhook or agent URL.
URL_CHARS = 2000
# A dedupe key (printable); a trace id (printable; a W3C trace id is 32 hex).
DEDUPE_KEY_CHARS = 255
TRACE_ID_CHARS = 64
# An obligation note or an acknowledgement note.
NOTE_CHARS = 2000
# What people write in recovery: rationale, evidence, a lesson's parts.
TEXT_CHARS = 20_000
# A delivery attempt's error as kept on the record (longer ones are cut).
ERROR_CHARS = 2000
