"""What a worker's failure means for a plain job (one whose script never enters `hvd.elastic.run`),
and how a command that cannot start is named. Pure: the job acts on the verdicts (`job.Job`).

A worker of a plain job that failed restarts every worker from the first step (unless the script
loads a checkpoint), so only --max-restarts times; and once a worker has finished, a failure fails
the job (as horovodrun and torchrun: any rank's error is the job's).

A plain script never connects to the rendezvous, so a worker's error with output is any crash: a
rank's exception, or its peers' "connection closed" after it died, whichever the agents report
first. Only a command that cannot start (exit 126 or 127: not executable or not found; 2: Python's
"can't open file", a usage error) fails the job at once with what the worker said; another error
restarts it within --max-restarts (as torchrun does), and is named the same way once no restart
is left.
"""

from __future__ import annotations

from typing import Sequence

from ringmaster.rendezvous.control.records import Worker

#: Exit codes of a command that cannot start: 2 (Python's "can't open file", a usage error),
#: 126 (not executable), 127 (not found).
COMMAND_ERROR_CODES = frozenset({2, 126, 127})


def command_failed(worker: Worker, how: str, output: str, command: Sequence[str]) -> str:
    """A worker's own error before it reached the rendezvous: the command is wrong (every host
    would fail alike), and the job fails at once, with what the worker said."""
    return (f"worker {worker.worker_id} on {worker.host} {how} before it reached the rendezvous: {output} "
            f"(the training command: {' '.join(command)[:300]}); fix the command")


def plain_failure(worker: Worker, how: str, output: str, exit_code: int, failures: int, limit: int,
                  finishing: bool, command: Sequence[str]) -> str | None:
    """Why the plain job fails at its `failures`-th worker failure (--max-restarts `limit`), or
    None: it restarts."""
    unstarted = not worker.registered and bool(output)
    if unstarted and (exit_code in COMMAND_ERROR_CODES or failures > limit):
        return command_failed(worker, how, output, command)
    if finishing:
        return (f"worker {worker.worker_id} on {worker.host} {how} after another worker had finished; any "
                "worker's error fails a plain job (one without hvd.elastic.run)")
    if failures > limit:
        done = f"after {limit} restart(s) " if limit else ""
        return (f"worker {worker.worker_id} on {worker.host} {how} {done}(--max-restarts {limit}): a plain job "
                "(one without hvd.elastic.run) restarts every worker from its first step after a failure, unless "
                "it loads a checkpoint; fix the error above, or allow restarts with --max-restarts N")
    return None
