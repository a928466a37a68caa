"""A worker's line to the rendezvous: its session stream, heartbeats, and what it was told.

Events arrive on a background thread and are kept as plain facts (latest assignment, which
generation is over, the latest hosts-update sequence, retire/job-end). Threads that wait on a
collective register an `threading.Event` here; any event that makes their wait pointless
(generation over, rendezvous lost, retire) sets it, so nobody polls.

A lost session (the rendezvous restarted or failed over) is reopened with the next listed
address, with backoff; training goes on meanwhile. The hello of a reopened session says
whether the worker waits for a new generation, so the new rendezvous needs no replay.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

import grpc

from ringmaster.common.beat_relay import MAX_RELAYED_SPANS, BeatSender
from ringmaster.common.dial import AWAY_CODES, dial
from ringmaster.common.errors import JobError
from ringmaster.common.event_relay import EventReceiver
from ringmaster.common.grpc_auth import Credentials
from ringmaster.common.heartbeats import paced_interval
from ringmaster.common.reconnect import Backoff, parse_addresses
from ringmaster.common.spans import MAX_SPANS_PER_HEARTBEAT, SpanRecorder
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.proto import ringmaster_pb2_grpc as pb_grpc
from ringmaster.settings import DEFAULT_RECONNECT_TIMEOUT_S, HEARTBEAT_RPC_TIMEOUT_S, RPC_TIMEOUT_S
from ringmaster.worker.train.say import Kind, say

#: Seconds a worker whose ring failed waits for the rendezvous to say so before it reports the
#: failure itself (`RendezvousLink.ready`): the rendezvous sees a dead worker's session close
#: within milliseconds, so this bounds only a failure it cannot see. A large job's (its agent
#: carries its beats) waits longer: its rendezvous takes a second or two to decide on a lost host,
#: and 32,768 survivors asking meanwhile would cost it more than that.
REJOIN_NOTICE_S = 0.5
REJOIN_NOTICE_LARGE_S = 5.0


class Retired(JobError):
    """The rendezvous does not need this worker any more; it should exit 0."""


class JobEnded(JobError):
    """The job is over (`success` says how); the worker exits with the job's verdict."""

    def __init__(self, success: bool, reason: str) -> None:
        super().__init__(reason)
        self.success = success


class RendezvousLink:
    def __init__(self, address: str, worker_id: str, host: str, heartbeat_interval_s: float = 1.0,
                 reconnect_timeout_s: float = DEFAULT_RECONNECT_TIMEOUT_S, credentials: Credentials | None = None,
                 ca_pem: bytes | None = None, stats: Callable[[], pb.WorkerStats] | None = None,
                 spans: SpanRecorder | None = None) -> None:
        """`credentials`: this worker's own key, every call is signed with; `ca_pem`: the CA of the
        rendezvous' TLS certificate (both handed over by the agent in the environment); `stats()`: the
        worker's figures, sent with every heartbeat; `spans`: its timeline spans, taken by them."""
        self._stats = stats
        self.spans = spans
        self._ca_pem = ca_pem
        self.addresses = parse_addresses(address)
        self._credentials = credentials
        self.address = self.addresses[0]
        self.worker_id = worker_id
        self.host = host
        self.heartbeat_interval_s = self._base_interval_s = heartbeat_interval_s
        self.commits = 0
        self.steps_since_commit = 0  # optimizer steps a rollback now would undo
        self.elastic = False
        self._cond = threading.Condition()
        self._assignment: pb.Assignment | None = None
        self._over: dict[int, str] = {}
        self._rejoining: set[int] = set()  # generations over whose next this worker is placed in unasked
        # ... and those of them whose promise was taken back (a replica group's member left over: it
        # must ask once it is out of the generation's collectives), and those it asked after
        self._unpromised: set[int] = set()
        self._asked: set[int] = set()
        self._placed_at_update: set[int] = set()  # generations whose host update places this worker unasked
        self._hosts_sequence = 0
        self._checkpoint_sequence = 0  # the newest host update that asked for a durable commit first
        self._announced_sequence = 0  # the newest announcement of newcomers (`HostsAnnounced`)
        self._claimed_sequence = 0  # the newest announcement this worker's script took as a host update
        self._awaits_hosts = 0  # the announcement this worker resets for, said with its next Ready
        self._retired: str | None = None
        self._ended: pb.JobEnded | None = None
        self._lost: str | None = None
        self._waiters: set[threading.Event] = set()
        self._closed = threading.Event()
        self._beat_now = threading.Event()  # set: heartbeat before the interval is over
        self._backoff = Backoff(reconnect_timeout_s)
        self._channel: grpc.Channel | None = None
        self._stub: pb_grpc.RendezvousStub | None = None
        self._session = None
        self._waiting: tuple[int, str] | None = None  # (after_generation, failure) of the last Ready
        self._threads: list[threading.Thread] = []
        self._relay = BeatSender()  # to this host's agent, when it carries the beats
        self._carried: EventReceiver | None = None  # what this host's agent carries for us (a large job's)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._carried = EventReceiver(self._relay.folder, self._on_event)  # (listening before the hello says so)
        if not self._open():
            raise ConnectionError(f"cannot reach the rendezvous at {', '.join(self.addresses)}")
        self._threads = [threading.Thread(target=self._read, name="ringmaster-session", daemon=True),
                         threading.Thread(target=self._beat, name="ringmaster-heartbeat", daemon=True)]
        for thread in self._threads:
            thread.start()

    def close(self, join_timeout_s: float = 2.0) -> None:
        """End the session and wait (bounded) for its threads: a thread woken by the channel's
        teardown after the interpreter began to finalize would abort the process. The last
        timeline spans go out first."""
        if self.spans is not None and self.spans.pending() and self._lost is None and not self._closed.is_set():
            self.heartbeat_now(timeout_s=join_timeout_s, direct=True)  # (its agent may not carry them before it exits)
        self._closed.set()
        self._relay.close()
        if self._carried is not None:
            self._carried.close()
        self._beat_now.set()  # the heartbeat thread ends now, not at its interval's end
        if self._session is not None:
            self._session.cancel()
        if self._channel is not None:
            self._channel.close()
        deadline = time.monotonic() + join_timeout_s
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def _open(self) -> bool:
        """Open a session with the first listed rendezvous that answers; False past the deadline."""
        while not self._closed.is_set():
            dialed = dial(self.addresses, self._backoff, self._closed, self._credentials, self._ca_pem)
            if dialed is None:
                return False
            address, channel = dialed
            with self._cond:
                waiting = self._waiting
            hello = pb.WorkerHello(worker_id=self.worker_id, host=self.host, pid=os.getpid(), elastic=self.elastic,
                                   waiting=waiting is not None, after_generation=waiting[0] if waiting else 0,
                                   failure=waiting[1] if waiting else "",
                                   hears_agent=self._carried is not None and self._carried.listening)
            old = self._channel
            self.address, self._channel, self._stub = address, channel, pb_grpc.RendezvousStub(channel)
            self._session = self._stub.WorkerSession(hello)
            if old is not None:
                old.close()
            return True
        return False

    # ------------------------------------------------------------ requests
    def ready(self, after_generation: int, failure: str = "") -> None:
        """Ask for a generation newer than `after_generation`. If the rendezvous is away, the
        request goes with the hello of the next session instead.

        After a failure (`failure`), the rendezvous most likely knows already (a closed session)
        and says the generation is over, placing a worker inside `hvd.elastic.run` in the next one
        without being asked (`GenerationOver.rejoin`): the worker waits up to REJOIN_NOTICE_S
        (a large job's: REJOIN_NOTICE_LARGE_S) for that word and then only for its place. What it
        would have said goes with a `Ready` only if the word does not come (a failure the
        rendezvous cannot see: a partition between workers).

        At a host update's commit a member told it is placed unasked (`HostsUpdated.placed`: one
        member reports the commit, and it is every member's) waits as long for its place or
        its retirement, and asks only if neither comes."""
        with self._cond:
            if self._placed_after(after_generation):
                return  # assigned already (after a failure the rendezvous does not wait to be asked)
            self._waiting = (after_generation, failure)
            unasked = bool(failure) or after_generation in self._placed_at_update
            notice = (REJOIN_NOTICE_LARGE_S if self._relay.relaying() else REJOIN_NOTICE_S) if unasked else 0.0
            deadline = time.monotonic() + notice
            while not self._placed_after(after_generation) and after_generation not in self._over:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._retired is not None or self._ended is not None or self._lost is not None:
                    break
                self._cond.wait(remaining)
            if self._placed_after(after_generation) or self._promised(after_generation):
                return  # placed already, or sure to be: no call
            if unasked and (self._retired is not None or self._ended is not None):
                return  # told to leave instead (`wait_assignment` raises it)
            awaits, self._awaits_hosts = (0 if failure else self._awaits_hosts), 0
            self._asked.add(after_generation)
        request = pb.ReadyRequest(worker_id=self.worker_id, after_generation=after_generation, failure=failure,
                                  elastic=self.elastic, awaits_hosts=awaits)
        if self._relay.relaying() and self._relay.send_ready(request.SerializeToString()):
            return  # its agent carries it, with its host's others (beat_relay.py); a refusal comes on the stream
        try:
            reply = self._call("Ready", request)
        except grpc.RpcError as exc:
            if exc.code() in AWAY_CODES:
                return
            raise
        if not reply.ok:
            raise Retired(reply.message)

    def _placed_after(self, generation: int) -> bool:
        return self._assignment is not None and self._assignment.generation > generation

    def _promised(self, generation: int) -> bool:
        """Placed in the generation after `generation` without asking (`GenerationOver.rejoin`),
        and not told since to ask after all."""
        return generation in self._rejoining and generation not in self._unpromised

    def _must_ask(self, generation: int) -> bool:
        """Promised a place after `generation`, the promise taken back, not asked yet."""
        return generation in self._rejoining and generation in self._unpromised and generation not in self._asked

    def report_done(self, warning: str = "", fatal: str = "") -> None:
        """Say the training function returned (and what the job's end must report), or (`fatal`)
        that the job cannot go on for a cause of its own; retried until a rendezvous has heard it."""
        backoff = Backoff(self._backoff.timeout_s)
        while True:
            try:
                self._call("ReportDone", pb.DoneRequest(worker_id=self.worker_id, commits=self.commits,
                                                        warning=warning[:2000], fatal=fatal[:2000]))
                return
            except grpc.RpcError as exc:
                if exc.code() not in AWAY_CODES or backoff.next_address(["retry"]) is None:
                    raise

    def _call(self, method: str, request):
        stub = self._stub
        assert stub is not None
        return getattr(stub, method)(request, timeout=RPC_TIMEOUT_S)

    def heartbeat_now(self, timeout_s: float = HEARTBEAT_RPC_TIMEOUT_S, direct: bool = False) -> bool:
        """Send a heartbeat now, to the rendezvous or (a large job's, unless `direct`) to this
        host's agent, which carries it (`beat_relay.py`); False if it did not get through (a lost
        rendezvous is noticed by the session reader, not here)."""
        stub = self._stub
        if stub is None:
            return False
        relaying = not direct and self._relay.relaying()
        spans = self.spans
        taken = spans.take(MAX_RELAYED_SPANS if relaying else MAX_SPANS_PER_HEARTBEAT) \
            if spans is not None and spans.on else []
        request = pb.WorkerHeartbeatRequest(worker_id=self.worker_id, commits=self.commits, elastic=self.elastic,
                                            steps_since_commit=self.steps_since_commit,
                                            stats=self._stats() if self._stats is not None else None,
                                            spans=SpanRecorder.proto(taken),
                                            spans_dropped=spans.dropped if spans is not None else 0)
        if relaying and self._relay.send(request.SerializeToString()):
            self.heartbeat_interval_s = self._base_interval_s  # (the agent's pace is the rendezvous' concern)
            return True
        try:
            answer = stub.WorkerHeartbeat(request, timeout=timeout_s)
            self.heartbeat_interval_s = paced_interval(answer.heartbeat_interval_s, self._base_interval_s)
            return True
        except (grpc.RpcError, ValueError):  # (ValueError: the channel was closed meanwhile)
            if taken:
                spans.give_back(taken)  # type: ignore[union-attr]
            return False

    # ------------------------------------------------------------ facts
    def wait_assignment(self, after_generation: int, timeout_s: float | None = None) -> pb.Assignment:
        """Block until an assignment newer than `after_generation` arrives. A worker promised
        its place that is told to ask after all (it was left over) asks from here: it waits here
        only once it is out of the ended generation's collectives."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._cond:
                while True:
                    self._raise_if_finished()
                    if self._assignment is not None and self._assignment.generation > after_generation:
                        self._waiting = None
                        return self._assignment
                    if self._must_ask(after_generation):
                        waiting = self._waiting
                        failure = waiting[1] if waiting is not None and waiting[0] == after_generation else ""
                        break
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError(f"no generation after {after_generation} within {timeout_s:g} s")
                    self._cond.wait(remaining)
            self.ready(after_generation, failure)

    def wait_planned(self, generation: int) -> pb.Assignment | None:
        """Block until this worker's place in `generation` (the generation it was started for)
        or a newer one arrives; None if `generation` ended before it was placed in any: a member
        slow to start (importing, building its model on a loaded host) whose peers failed meanwhile.
        It then joins a later generation as a newcomer would."""
        with self._cond:
            while True:
                self._raise_if_finished()
                if self._assignment is not None and self._assignment.generation >= generation:
                    self._waiting = None
                    return self._assignment
                if generation in self._over:
                    return None
                self._cond.wait()

    def generation_over(self, generation: int) -> str | None:
        """Why `generation` ended, or None while it stands. Collectives do not need the
        rendezvous, so losing it does not end a generation."""
        with self._cond:
            if self._retired is not None or self._ended is not None:
                return "the worker is leaving the job"
            return self._over.get(generation)

    def leaving(self) -> bool:
        """The rendezvous told this worker to go (retired, or the job ended). A collective cut
        for it is not a peer's failure: the worker leaves, and nothing of it is rolled back."""
        with self._cond:
            return self._retired is not None or self._ended is not None

    def wait_generation_over(self, generation: int, timeout_s: float) -> str | None:
        """Why `generation` ended, waited for up to `timeout_s`; None if it still stands then."""
        deadline = time.monotonic() + timeout_s
        with self._cond:  # (a re-entrant lock: `generation_over` takes it again)
            while (why := self.generation_over(generation)) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return why

    def hosts_sequence(self) -> int:
        with self._cond:
            return self._hosts_sequence

    def announced_sequence(self) -> int:
        """The newest announcement that newcomers are coming (not an interrupt by itself)."""
        with self._cond:
            return self._announced_sequence

    def claim_announced(self, baseline: int) -> int:
        """The announcement newer than `baseline`, now claimed (0 if none): this worker's script
        took it as Horovod's word of new hosts, so its next commit resets (`claimed_sequence`)."""
        with self._cond:
            if self._announced_sequence <= baseline:
                return 0
            self._claimed_sequence = max(self._claimed_sequence, self._announced_sequence)
            return self._claimed_sequence

    def claimed_sequence(self) -> int:
        with self._cond:
            return self._claimed_sequence

    def awaits_hosts(self, sequence: int) -> None:
        """This worker resets for announcement `sequence` (its script awaited the newcomers):
        its next `Ready` says so, and the next ring waits for them."""
        with self._cond:
            self._awaits_hosts = max(self._awaits_hosts, sequence)

    def checkpoint_sequence(self) -> int:
        """The newest host update that asked rank 0 to make its commit durable before anyone
        leaves (a drain that leaves too few workers); 0 if none."""
        with self._cond:
            return self._checkpoint_sequence

    def add_waiter(self, event: threading.Event) -> None:
        with self._cond:
            self._waiters.add(event)

    def remove_waiter(self, event: threading.Event) -> None:
        with self._cond:
            self._waiters.discard(event)

    def _raise_if_finished(self) -> None:
        if self._ended is not None:
            raise JobEnded(self._ended.success, self._ended.reason)
        if self._retired is not None:
            raise Retired(self._retired)
        if self._lost is not None:
            raise ConnectionError(f"lost the rendezvous at {self.address}: {self._lost}")

    # ------------------------------------------------------------ threads
    def _read(self) -> None:
        while True:
            session = self._session
            assert session is not None
            try:
                for event in session:
                    self._on_event(event)
                    self._backoff.reset()
                reason = "the rendezvous closed the session"
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:  # this rendezvous does not know us
                    with self._cond:
                        self._retired = self._retired or exc.details()
                        self._wake()
                    return
                reason = f"{exc.code().name}: {exc.details()}"
            with self._cond:
                finished = self._closed.is_set() or self._retired is not None or self._ended is not None
            if finished:
                with self._cond:
                    self._wake()
                return
            say(Kind.LINK_LOST, address=self.address, reason=reason)
            if not self._open():
                with self._cond:
                    if not self._closed.is_set():
                        self._lost = f"{reason}; no rendezvous at {', '.join(self.addresses)} answered"
                    self._wake()
                return

    def _on_event(self, event: pb.WorkerEvent) -> None:
        """Keep what a message says, from the session or from the agent (a large job's: see
        event_relay.py). The two ways in are not ordered with each other, so every fact kept is
        one a late message cannot take back: the newest assignment, each generation's end, the
        highest host update, retire and job end."""
        kind = event.WhichOneof("event")
        with self._cond:
            if kind == "assignment":
                if event.assignment.ends_generation:  # (a survivor's "generation over", said with its next place)
                    self._over[event.assignment.ends_generation] = event.assignment.ends_reason or "generation over"
                if self._assignment is None or event.assignment.generation > self._assignment.generation:
                    self._assignment = event.assignment
            elif kind == "generation_over":
                self._over[event.generation_over.generation] = event.generation_over.reason or "generation over"
                if event.generation_over.rejoin:
                    self._rejoining.add(event.generation_over.generation)
                else:  # (said after a promise: the promise is taken back, whatever order the two arrive in)
                    self._unpromised.add(event.generation_over.generation)
            elif kind == "hosts_updated":
                self._hosts_sequence = max(self._hosts_sequence, event.hosts_updated.sequence)
                if event.hosts_updated.placed:
                    self._placed_at_update.add(event.hosts_updated.generation)
                if event.hosts_updated.checkpoint:
                    self._checkpoint_sequence = max(self._checkpoint_sequence, event.hosts_updated.sequence)
            elif kind == "hosts_announced":
                self._announced_sequence = max(self._announced_sequence, min(event.hosts_announced.sequence, 1 << 62))
            elif kind == "retire":
                self._retired = event.retire.reason or "retired"
            elif kind == "job_ended":
                self._ended = event.job_ended
            self._wake()

    def _wake(self) -> None:
        for event in self._waiters:
            event.set()
        self._cond.notify_all()

    def beat_soon(self) -> None:
        """Have the heartbeat thread beat now rather than at the end of its interval."""
        self._beat_now.set()

    def _beat(self) -> None:
        while not self._closed.is_set():
            self._beat_now.wait(self.heartbeat_interval_s)
            self._beat_now.clear()
            if self._closed.is_set():
                return
            if self.heartbeat_now() and self.spans is not None and self.spans.pending() >= MAX_SPANS_PER_HEARTBEAT // 2:
                self._beat_now.set()  # a busy timeline: its spans go out as fast as they come
