"""The job state machine: every state a job can be in, and every named transition.

States:

    ready      waiting for `run_at`, then for a consumer to lease it
    leased     held by one consumer (lease token + deadline); its attempt is spent by the lease
    relayed    a queue a broker holds: its attempt's message is with the broker (PostgreSQL)
    done       final: the attempt ended, with an outcome — `completed` (this attempt claimed the
               key) or `duplicate` (the key was already claimed)
    dead       final until an operator replays it: a permanent failure, or attempts or max age
               spent
    cancelled  final: withdrawn before it ran, or a dead job an operator abandoned; its key free

Transitions (the function that builds each is named in the fourth column; a parenthesised name
is a store statement that moves the row itself; a test holds this table against the code):

    from              to          outcome    transition                  when
    -                 ready       -          (store.job_insert)          an enqueue
    -                 relayed     -          (store.job_insert)          an enqueue to a queue a
                                                                         broker holds
    ready             leased      -          (store.job_lease)           a consumer leases a batch
    ready             relayed     -          (store.job_relay_adopt)     a broker-held queue's ready
                                                                         job, handed to the relay
    leased|relayed    done        completed  completed                   the handler returned, or
                                                                         the job's own claim
                                                                         committed before (a lost
                                                                         ack)
    leased|relayed    done        duplicate  duplicate                   the key was claimed before
    leased|relayed    ready       -          retry                       a retryable failure
    leased|relayed    dead        -          dead                        permanent, attempts or max
                                                                         age spent, a delivery that
                                                                         cannot be read, a broker
                                                                         that gave up on it
    leased            ready       -          (store.job_release)         given back unrun: the
                                                                         attempt not spent
    leased (expired)  ready|dead  -          (store.job_rescue_expired)  the lease ran out: the
                                                                         attempt recorded as
                                                                         lease_expired
    ready|relayed     cancelled   -          (store.job_cancel)          an operator's cancel
    dead              ready       -          (store.job_replay)          an operator's replay: same
                                                                         key, a fresh attempt count
    dead              cancelled   -          (store.job_discard)         an operator abandons it

The four named transitions are how an attempt ends, decided by the consumer (`lanes/consumer.py`)
and settled in its transaction (`queue/transport.py`: `Settlement.of(delivery, transition)`),
fenced on the lease token — or, for a relayed job, on its attempt, and `ready` then means relayed
again: the next attempt's message is published when it is due. A message published straight
to a broker has no row: it ends in the same four, and its transport tells the broker after the
commit (`brokers/transport.py`). A superseded consumer settles nothing: its transaction is
rolled back. There is no snooze: a handler's `RetryLater(delay=…)`
is a `retry`, after its delay, and spends the attempt as every failure does (`jobs/retry.py`).

A give-back (shutdown, a claim that waited too long on a lock, key drift, a store outage) is not
a settlement: the transport releases the delivery (`Transport.release`; the table queue's
`job_release` is fenced on the token and the attempt, which it restores), so it needs no value
here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from oncebox.store.records import FinishState, Outcome

ZERO = timedelta(0)


@dataclass(frozen=True, slots=True)
class JobTransition:
    """How one attempt ends, apart from which job it is: the queue's `Settlement`, the store's
    `JobFinish` and `RelayedFinish` carry it with the job they settle. `delay` applies to
    `ready`."""

    state: FinishState
    outcome: Outcome | None = None
    delay: timedelta = ZERO
    error: str | None = None


# the two moves that carry nothing of their attempt, made once: a transition is frozen, and
# `completed` is asked for once per job on the consumer's path
_COMPLETED = JobTransition("done", "completed")
_DUPLICATE = JobTransition("done", "duplicate")


def completed() -> JobTransition:
    """This attempt holds the key's claim, and its handler's writes committed with it."""
    return _COMPLETED


def duplicate() -> JobTransition:
    """Another attempt claimed the key first: this one is done without running (a claim
    conflict), so its handler's effects happen once."""
    return _DUPLICATE


def retry(delay: timedelta, error: str) -> JobTransition:
    """A retryable failure: due again after `delay`, the attempt spent, its error recorded."""
    return JobTransition("ready", None, delay, error)


def dead(error: str) -> JobTransition:
    return JobTransition("dead", None, ZERO, error)
