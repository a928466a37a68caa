"""One error hierarchy for everything Ringmaster raises on purpose.

`str(error)` is written for users: what was wrong and what to do. `exit_code` is what the
`ringmaster` command exits with when the error ends it (2: the command or its input cannot
work as given; 1: the job ran and failed). Callers catch the branch they can handle:
`UsageError` (bad flags or input), `StateError` (the durable rendezvous state), `JobError`
(what ends or interrupts training in a worker).
"""

from __future__ import annotations


class RingmasterError(Exception):
    """Base of every error Ringmaster raises on purpose."""

    exit_code: int = 1


class UsageError(RingmasterError):
    """A flag, a file or an answer given by the user that cannot work; the message says what to change."""

    exit_code = 2


class StateError(RingmasterError):
    """The durable rendezvous state (the store, its record, the job's leadership) stands in the way."""

    exit_code = 2


class Refused(RingmasterError):
    """A request the job cannot grant now (an unknown worker, a scale past --max-np); the message
    says why. The rendezvous answers it on the wire; nothing changed."""


class JobError(RingmasterError):
    """Something that ends or interrupts training in a worker (a failed peer, a reset, the job's end)."""


class JobFatalError(JobError):
    """The training cannot go on on any host, for a cause that is the job's own (a refused or
    unfitting checkpoint), not the host's: a worker that meets it tells the rendezvous, which
    ends the job at once with the cause and blames no host (another host would meet the same)."""
