"""The ledger's turn services: the calls of the transition functions that
change a turn, the endpoint's lock and the ticket together
(tickets/sql/claimcheck_start_turn.sql, claimcheck_finish_turn.sql,
claimcheck_release_lock.sql, claimcheck_next_ticket.sql), and the reading
of what they answer, by column name.

The runtime (runtime/turns/) runs turns: it decides when to start, finish,
release or interrupt, runs the runner, publishes the broker messages and
watches heartbeats and budgets; what it records of a turn it records
through these.

- ``start``   a turn's start: the lock taken, the fencing token, the Turn
  row and its token; ``queued -> running``
- ``finish``  the call of the exact turn's finish and what it reports
- ``lock``    the lock's release and the endpoint's next ticket
- ``interrupt`` ``running -> interrupting`` and a ticket's cancel, with the
  runtime's step (an http agent's cancel URL) registered at start-up
- ``quarantine`` ``-> uncertain`` (the lock stays with the turn) and an
  owner's end of an uncertain turn, which frees its lock
- ``slots``   which worker pool process runs a turn (written by the start
  and the finish; what happens outside them, for the worker registry)
"""
