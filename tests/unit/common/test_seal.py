"""Keys per role and calls authenticated message by message (pure logic: no sockets).

The two ends are `CallerSeal` (an agent or worker) and `Gate` (the rendezvous); what a relay
could do to the bytes between them is done here to the values they exchange.
"""

from __future__ import annotations

import pytest

from ringmaster.common.keys import AGENT, WORKER, Identity, agent_key, key_of, parse_key, worker_key
from ringmaster.common.seal import CallerSeal, Gate, Replays, body_of, make_token
from ringmaster.common.secret import generate_secret
from ringmaster.proto import ringmaster_pb2 as pb

METHOD = "/ringmaster.v1.Rendezvous/AgentSession"
NOW = 1_800_000_000.0
SECRET = generate_secret()
HOST_A = Identity(AGENT, "hostA")
WORKER_A1 = Identity(WORKER, "hostA", "hostA/1")


def gate(secret: str = SECRET, window_s: float = 300.0) -> Gate:
    return Gate(lambda identity: key_of(secret, identity), lambda identity: None, window_s=window_s)


def caller(identity: Identity, request, now: float = NOW, secret: str = SECRET, method: str = METHOD) -> CallerSeal:
    return CallerSeal(key_of(secret, identity), identity, method, body_of(request), now)


def admitted(g: Gate, seal: CallerSeal, request, method: str = METHOD, now: float = NOW):
    admission, why = g.check(method, dict(seal.metadata)["ringmaster-auth"], body_of(request), now)
    assert admission is not None, why
    assert g.admit(admission, now) is None
    return admission


def test_keys_are_one_per_role_and_a_worker_key_comes_from_its_hosts_agent_key() -> None:
    a, b = agent_key(SECRET, "hostA"), agent_key(SECRET, "hostB")
    assert len(a) == 32 and a != b and a != agent_key(generate_secret(), "hostA")
    assert worker_key(a, "hostA/1") == key_of(SECRET, WORKER_A1) != worker_key(a, "hostA/2")
    assert key_of(SECRET, HOST_A) == a
    assert parse_key(a.hex(), "x") == a
    for bad in ("", "zz" * 32, a.hex()[:-1]):
        with pytest.raises(ValueError):
            parse_key(bad, "x")
    for text, identity in (("agent hostA", HOST_A), ("worker hostA hostA/1", WORKER_A1)):
        assert Identity.parse(text) == identity and identity.header() == text
    assert Identity.parse("agent bad name!") == Identity(AGENT, "bad name!")  # for the host-name rule to judge
    for text in (None, "", "agent", "agent ", "worker a", "worker a b c", "admin a", "x" * 1000):
        assert Identity.parse(text) is None


def test_a_token_proves_its_callers_key_over_this_very_request() -> None:
    hello = pb.AgentHello(host="hostA", pid=7)
    seal = caller(HOST_A, hello)
    token = dict(seal.metadata)["ringmaster-auth"]
    g = gate()
    admission, why = g.check(METHOD, token, body_of(hello), NOW + 1)
    assert admission is not None and admission.identity == HOST_A, why
    changed = pb.AgentHello(host="hostA", pid=7, running=["hostA/666"])
    for method, claimed, body, now, expected in (
        (METHOD, "agent hostA", body_of(changed), NOW, "does not prove the key of the agent of hostA"),
        ("/ringmaster.v1.Rendezvous/AgentHeartbeat", "agent hostA", body_of(hello), NOW, "does not prove"),
        (METHOD, "agent hostB", body_of(hello), NOW, "does not prove the key of the agent of hostB"),
        (METHOD, "worker hostA hostA/1", body_of(hello), NOW, "does not prove"),
        (METHOD, "agent hostA", body_of(hello), NOW + 301, "from this host's clock"),
        (METHOD, "nobody", body_of(hello), NOW, "names no identity"),
    ):
        admission, why = g.check(method, token.replace("|agent hostA|", f"|{claimed}|"), body, now)
        assert admission is None and expected in why, (method, claimed, why)
    foreign = caller(HOST_A, hello, secret=generate_secret())
    admission, why = g.check(METHOD, dict(foreign.metadata)["ringmaster-auth"], body_of(hello), NOW)
    assert admission is None and "does not prove" in why


@pytest.mark.parametrize("token", [None, "", "v1", "v2|agent hostA|1.2|abc|def", "v2|agent hostA|x.y|s|1|def",
                                   "v2|agent hostA|1.2|s|-3|ab", "v2|agent hostA|1.2|s|1_0|ab",
                                   "v2|agent hostA|1.2||1|ab", "v2|agent hostA|1.2|" + "s" * 40 + "|1|ab",
                                   "v2|" + "9" * 900, "a|b|c|d|e|f|g", "v2|agent a|b|1.2|s|1|ab"])
def test_malformed_tokens_are_refused_with_a_reason(token) -> None:
    admission, why = gate().check(METHOD, token, b"", NOW)
    assert admission is None and why


def test_an_identity_the_job_cannot_have_is_refused_before_any_key_is_derived() -> None:
    derived: list[Identity] = []

    def key(identity: Identity) -> bytes:
        derived.append(identity)
        return key_of(SECRET, identity)

    g = Gate(key, lambda identity: "bad name" if "\n" in identity.host or identity.host.startswith("-") else None)
    admission, why = g.check(METHOD, "v2|agent -oProxyCommand|1.2|s|3|ab", b"", NOW)
    assert admission is None and "bad name" in why and derived == []


def test_a_relay_cannot_insert_reorder_replay_drop_or_change_streamed_messages() -> None:
    hello = pb.AgentHello(host="hostA", pid=7)
    seal = caller(HOST_A, hello)
    admission = admitted(gate(), seal, hello)
    assert seal.opened(admission.keys.opening())
    sent = [admission.seal(pb.AgentCommand(workers=[pb.WorkerSpec(worker_id=f"hostA/{i}", argv=[b"python", b"t.py"],
                                                                   env={"B": b"2", "A": b"1"})])) for i in range(1, 5)]
    wire = [m.SerializeToString() for m in sent]

    def receive(raw: bytes) -> str | None:
        return seal.message(pb.AgentCommand.FromString(raw))

    assert receive(wire[0]) is None  # in order, untouched
    assert "came where message 2 was due" in receive(wire[2])  # message 2 dropped
    assert "came where message 2 was due" in receive(wire[0])  # message 1 again
    changed = pb.AgentCommand.FromString(wire[1])
    changed.workers[0].argv[:] = [b"/bin/sh", b"-c", b"id"]
    assert "does not carry this session's MAC" in seal.message(changed)
    inserted = pb.AgentCommand(workers=[pb.WorkerSpec(worker_id="hostA/666", argv=[b"/bin/sh"])])
    inserted.seal.sequence = 2
    inserted.seal.mac = b"\0" * 32
    assert "does not carry this session's MAC" in seal.message(inserted)
    assert "carries no seal" in seal.message(pb.AgentCommand(shutdown=True))
    assert receive(wire[1]) is None and receive(wire[2]) is None and receive(wire[3]) is None


def test_a_session_of_another_call_or_key_proves_nothing_here() -> None:
    hello = pb.AgentHello(host="hostA", pid=7)
    g = gate()
    first, second = caller(HOST_A, hello), caller(HOST_A, hello)
    one, two = admitted(g, first, hello), admitted(g, second, hello)
    assert not first.opened(two.keys.opening())  # another call's proof (a relay swapping streams)
    assert first.opened(one.keys.opening())
    message = two.seal(pb.AgentCommand(shutdown=True))
    assert "does not carry this session's MAC" in first.message(message)
    assert not caller(HOST_A, hello).opened("v2.0011223344556677." + "00" * 32)
    assert not caller(HOST_A, hello).opened(None)


def test_answers_and_refusals_are_bound_to_their_bytes() -> None:
    request = pb.WorkerExit(host="hostA", worker_id="hostA/1", exit_code=1)
    method = "/ringmaster.v1.Rendezvous/ReportWorkerExit"
    seal = caller(HOST_A, request, method=method)
    admission = admitted(gate(), seal, request, method=method)
    answer = pb.Ack(ok=True)
    proof = admission.keys.answer(body_of(answer))
    assert seal.answered(proof, body_of(answer))
    assert not seal.answered(proof, body_of(pb.Ack(ok=False, message="x")))
    refusal = admission.keys.refusal("FAILED_PRECONDITION", "unknown worker")
    assert seal.refused(refusal, "FAILED_PRECONDITION", "unknown worker")
    assert not seal.refused(refusal, "FAILED_PRECONDITION", "another reason")
    assert not seal.refused(refusal, "ALREADY_EXISTS", "unknown worker")
    assert not seal.refused(None, "ALREADY_EXISTS", "unknown worker")


@pytest.mark.slow  # (200,000 signed calls: 7 s of the fast suite's budget; the whole suite runs it)
def test_a_token_works_once_however_many_calls_come_between() -> None:
    """The replay memory forgets callers, not calls: a token captured and sent again after 200,000
    other calls (the old memory of 100,000 nonces had forgotten it) is still refused."""
    request = pb.AgentHeartbeatRequest(host="hostA")
    method = "/ringmaster.v1.Rendezvous/AgentHeartbeat"
    g = gate()
    captured = caller(HOST_A, request, method=method)
    admitted(g, captured, request, method=method)
    key = key_of(SECRET, WORKER_A1)
    body = body_of(pb.WorkerHeartbeatRequest(worker_id="hostA/1"))
    for i in range(200_000):  # other calls, by one worker (the agent's own calls would do as well)
        token = make_token(key, WORKER_A1, "/ringmaster.v1.Rendezvous/WorkerHeartbeat", body, NOW, ("w0rker", i + 1))
        admission, why = g.check("/ringmaster.v1.Rendezvous/WorkerHeartbeat", token, body, NOW)
        assert admission is not None and g.admit(admission, NOW) is None, why
    admission, why = g.check(method, dict(captured.metadata)["ringmaster-auth"], body_of(request), NOW + 10)
    assert admission is not None  # the token itself is good...
    assert "used before" in g.admit(admission, NOW + 10)  # ...but it was used


def test_calls_that_overtake_each_other_are_taken_and_a_restarted_caller_starts_a_new_series() -> None:
    """64 calls of one process in flight at once, signed milliseconds apart, arrive in any order;
    a new process of the same identity numbers its calls from 1 again."""
    request = pb.AgentHeartbeatRequest(host="hostA")
    method = "/ringmaster.v1.Rendezvous/AgentHeartbeat"
    g = gate()
    key = key_of(SECRET, HOST_A)
    tokens = [make_token(key, HOST_A, method, body_of(request), NOW + i * 0.002, ("first", i + 1)) for i in range(64)]
    tokens += [make_token(key, HOST_A, method, body_of(request), NOW + 1, ("second", i + 1)) for i in range(3)]
    for token in reversed(tokens):
        admission, why = g.check(method, token, body_of(request), NOW + 1)
        assert admission is not None and g.admit(admission, NOW + 1) is None, why


def test_replays_take_calls_a_little_out_of_order_and_forget_only_what_the_clock_check_refuses() -> None:
    replays = Replays(window_s=10, max_callers=2, slack=4)
    assert replays.accept("a", 100, NOW) is None
    assert replays.accept("a", 102, NOW) is None
    assert replays.accept("a", 101, NOW) is None  # a little late: another thread of the caller
    assert "used before" in replays.accept("a", 101, NOW)
    assert "used before" in replays.accept("a", 102, NOW)
    assert "calls behind" in replays.accept("a", 98, NOW)  # beyond the slack
    assert replays.accept("a", 10_000, NOW) is None  # a jump far ahead
    assert "calls behind" in replays.accept("a", 102, NOW)
    assert replays.accept("b", 5, NOW) is None
    assert "callers are remembered already" in replays.accept("c", 5, NOW)  # full: refused, not forgotten
    assert replays.accept("c", 5, NOW + 21) is None  # a and b were last heard 2 windows ago: forgotten
    assert len(replays) == 1
