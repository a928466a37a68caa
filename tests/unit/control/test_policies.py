"""The two job policies' verdicts, as a table: what an exit means for a plain script and for an
elastic one (the coordinator acts on these; the e2e tests run both kinds of job)."""

from __future__ import annotations

import pytest

from ringmaster.rendezvous.control.policies import ELASTIC, PLAIN, ExitMeaning, generation_policy, policy_of
from ringmaster.rendezvous.control.records import Phase, Worker


def worker(elastic: bool, **state) -> Worker:
    w = Worker("h/1", "h", 0, {})
    w.elastic, w.registered, w.phase = elastic, elastic, Phase.MEMBER
    for name, value in state.items():
        setattr(w, name, value)
    return w


@pytest.mark.parametrize("policy, code, sig, member, meaning, blacklist, by_itself", [
    (PLAIN, 0, 0, True, ExitMeaning.FINISHED, False, False),   # torchrun: a member exiting 0 finished
    (PLAIN, 0, 0, False, ExitMeaning.FAILED, False, False),    # a newcomer leaving early did not
    (PLAIN, 1, 0, True, ExitMeaning.FAILED, True, False),      # restarted as a whole, not the script's blame
    (ELASTIC, 0, 0, True, ExitMeaning.FAILED, False, False),   # finished means its function returned
    (ELASTIC, 1, 0, True, ExitMeaning.FAILED, True, True),     # Horovod: its own error blacklists its host
    (ELASTIC, 0, 9, True, ExitMeaning.FAILED, True, False),    # killed: spared when it is the last host
])
def test_exit_verdicts(policy, code, sig, member, meaning, blacklist, by_itself) -> None:
    verdict = policy.exit_verdict(worker(policy is ELASTIC), code, sig, False, True, member)
    assert (verdict.meaning, verdict.blacklist, verdict.by_itself) == (meaning, blacklist, by_itself)


def test_a_stop_we_asked_for_and_a_done_worker_are_never_failures() -> None:
    for policy in (PLAIN, ELASTIC):
        stopping = worker(policy is ELASTIC, stopping=True)
        assert policy.exit_verdict(stopping, 1, 0, False, True, True).meaning is ExitMeaning.STOPPED
        done = worker(policy is ELASTIC, done=True)
        assert policy.exit_verdict(done, 0, 0, False, True, True).meaning is ExitMeaning.FINISHED
        # the agent stopped a worker already counted failed: a crash the agent tidied up
        assert policy.exit_verdict(worker(policy is ELASTIC), 0, 15, True, False, True).meaning is ExitMeaning.FAILED


def test_which_policy_applies() -> None:
    plain, elastic = worker(False), worker(True)
    assert policy_of(plain) is PLAIN and policy_of(elastic) is ELASTIC
    assert generation_policy([plain, plain], False) is PLAIN and generation_policy([plain, elastic], False) is ELASTIC
    connected = worker(False, registered=True)  # (hvd.init, not inside hvd.elastic.run yet)
    assert generation_policy([plain, connected], True) is ELASTIC  # launched elastic: once a member connected
    assert generation_policy([worker(False, registered=False)], True) is PLAIN  # (a plain script never does)
    assert ELASTIC.grows_in_place() and not PLAIN.grows_in_place()
    assert ELASTIC.closed_connection_is_failure() and not PLAIN.closed_connection_is_failure()
    assert ELASTIC.leaves_at_commit(elastic) and not PLAIN.leaves_at_commit(plain)
