"""`make run`'s console: a supervisord event listener (scripts/run.py's
configuration) that writes each line a process prints as
``HH:MM:SS name   | line`` on its standard error, which supervisord passes
to the terminal. Standard output is supervisord's event protocol
(supervisord.org, "Event Listener Notification Protocol"), spoken here on
bytes: the header's ``len`` counts bytes."""

from __future__ import annotations

import sys
import time


def main() -> None:
    events, answers, out = sys.stdin.buffer, sys.stdout.buffer, sys.stderr.buffer
    partial: dict[bytes, bytes] = {}
    while True:
        answers.write(b"READY\n")
        answers.flush()
        header = events.readline()
        if not header:
            return  # supervisord is gone
        fields = dict(word.split(b":", 1) for word in header.split())
        payload = events.read(int(fields[b"len"]))
        meta, _, data = payload.partition(b"\n")
        name = dict(word.split(b":", 1) for word in meta.split()).get(b"processname", b"?")
        *lines, partial[name] = (partial.get(name, b"") + data).split(b"\n")
        stamp = time.strftime("%H:%M:%S").encode()
        out.write(b"".join(b"%s %-7s| %s\n" % (stamp, name, line) for line in lines))
        out.flush()
        answers.write(b"RESULT 2\nOK")
        answers.flush()


if __name__ == "__main__":
    main()
