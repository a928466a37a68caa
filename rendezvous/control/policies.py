"""The two kinds of job, as two policies: what an event means for a plain script and for an
elastic one. Pure functions over the coordinator's records; the coordinator asks, then acts.

- `PLAIN`: a `torch.distributed` script (torchrun's contract). Its workers cannot rejoin a ring,
  so any change restarts the whole generation, and a member that exits cleanly has finished.
- `ELASTIC`: a script inside `hvd.elastic.run` (Horovod's contract). Survivors roll back and
  rejoin, newcomers warm up and join at a commit, a worker's own error blacklists its host.

A worker is elastic once it says so (its heartbeats and Ready calls carry the flag); a
generation follows the elastic policy when its members run inside `hvd.elastic.run`, or from
its first second when the job was launched elastic (`JobSettings.elastic`: --min-np below
--max-np, a discovery script, ...), as horovodrun and torchrun decide it from the launch: a
member slow to reach `hvd.elastic.run` then never turns a failure into a restart of all.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ringmaster.rendezvous.control.records import Phase, Worker


class ExitMeaning(enum.Enum):
    STOPPED = "stopped"  # we asked it to stop (or its agent did, while it was live)
    FINISHED = "finished"  # its work is done
    FAILED = "failed"  # anything else


@dataclass(frozen=True)
class ExitVerdict:
    meaning: ExitMeaning
    blacklist: bool = False  # its host is to be blacklisted (a non-zero exit or a signal)
    by_itself: bool = False  # the script's own error (Horovod's case): blacklisted whatever is left


class JobPolicy:
    """The decisions that differ between plain and elastic jobs."""

    name = "?"

    def exit_verdict(self, worker: Worker, exit_code: int, signal_number: int, stopped_by_agent: bool,
                     was_live: bool, member: bool) -> ExitVerdict:
        """What a worker's exit means. The agent's word counts only for a worker still counted
        live: one already counted failed (its connection closed) and stopped by its agent is a
        crash that the agent tidied up."""
        if worker.stopping or (stopped_by_agent and was_live):
            return ExitVerdict(ExitMeaning.STOPPED)
        clean = exit_code == 0 and signal_number == 0
        if worker.done or (clean and self.clean_exit_finishes(member)):
            return ExitVerdict(ExitMeaning.FINISHED)
        return ExitVerdict(ExitMeaning.FAILED, blacklist=not clean,
                           by_itself=not clean and self.own_error(signal_number))

    def clean_exit_finishes(self, member: bool) -> bool:
        raise NotImplementedError

    def own_error(self, signal_number: int) -> bool:
        raise NotImplementedError

    def closed_connection_is_failure(self) -> bool:
        """Is a worker whose session closed (before its training function returned) failed now,
        before its exit status arrives?"""
        raise NotImplementedError

    def rejoins(self, worker: Worker) -> bool:
        """Can this worker hear that its generation is over and rejoin the next one? Otherwise
        it is stopped, and the whole generation restarts (torchrun)."""
        return worker.registered

    def leaves_at_commit(self, worker: Worker) -> bool:
        """Does a member on a host that left the job leave at its next commit (a host update),
        rather than ending its generation now?"""
        raise NotImplementedError

    def grows_in_place(self) -> bool:
        """Do newcomers join the running ring (at a commit), rather than a restart of all?"""
        raise NotImplementedError


class PlainPolicy(JobPolicy):
    name = "plain"

    def clean_exit_finishes(self, member: bool) -> bool:
        return member  # torchrun: a member that exits 0 has finished

    def own_error(self, signal_number: int) -> bool:
        return False  # restarted as a whole, without a blacklist for its last hosts

    def closed_connection_is_failure(self) -> bool:
        return False  # an exit may be success: the agent reports the code

    def leaves_at_commit(self, worker: Worker) -> bool:
        return False

    def grows_in_place(self) -> bool:
        return False


class ElasticPolicy(JobPolicy):
    name = "elastic"

    def clean_exit_finishes(self, member: bool) -> bool:
        return False  # finished means its training function returned (ReportDone)

    def own_error(self, signal_number: int) -> bool:
        return signal_number == 0  # Horovod: the script's error blacklists its host

    def closed_connection_is_failure(self) -> bool:
        return True  # it did not return from its training function: it died

    def leaves_at_commit(self, worker: Worker) -> bool:
        return worker.phase is Phase.MEMBER

    def grows_in_place(self) -> bool:
        return True


PLAIN = PlainPolicy()
ELASTIC = ElasticPolicy()


def policy_of(worker: Worker) -> JobPolicy:
    """The policy a worker's events follow."""
    return ELASTIC if worker.elastic else PLAIN


def generation_policy(members: list[Worker], launched_elastic: bool) -> JobPolicy:
    """A generation grows in place once its members run inside `hvd.elastic.run`, or, in a job
    launched elastic, once one of them connected (a Ringmaster script: a plain one never does,
    and is restarted as a whole on a change, as torchrun's `--nnodes MIN:MAX`)."""
    if any(w.elastic for w in members) or (launched_elastic and any(w.registered for w in members)):
        return ELASTIC
    return PLAIN
