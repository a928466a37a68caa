"""The worker's place in the job: its current assignment and ring, and how it (re)joins.

A worker started with its generation in its environment (the first generation, or a plain
restart) joins that generation at `hvd.init()`. A newcomer started while others train only
registers, builds its model, and reports ready when it enters `hvd.elastic.run`; survivors are
interrupted only then, so they never wait for a newcomer's imports.

Without Ringmaster's environment (`python train.py` on its own) the worker is a job of one.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import grpc
import torch
import torch.distributed as dist

from ringmaster.common.errors import JobError, UsageError
from ringmaster.common.figures import WorkerFigures
from ringmaster.common.grpc_auth import Credentials
from ringmaster.common.keys import WORKER, WORKER_KEY_ENV, Identity, parse_key
from ringmaster.common.spans import TIMELINE_SPANS_ENV, SpanRecorder, now_us
from ringmaster.common.tls import TLS_CA_ENV
from ringmaster.proto import environment as env_names
from ringmaster.proto import ringmaster_pb2 as pb
from ringmaster.settings import DEFAULT_COLLECTIVE_TIMEOUT_S, DEFAULT_RECONNECT_TIMEOUT_S
from ringmaster.worker.train import exiting
from ringmaster.worker.train.collectives import Communicator, build_process_group, gloo_device
from ringmaster.worker.train.errors import HorovodInternalError
from ringmaster.worker.train.exiting import leave
from ringmaster.worker.train.gpu_sharing import nccl_refusal
from ringmaster.worker.train.host_signals import shield_from_host_signals
from ringmaster.worker.train.link import JobEnded, RendezvousLink, Retired
from ringmaster.worker.train.say import Kind, say


def _credentials(env: dict[str, str], worker_id: str, host: str) -> Credentials | None:
    """This worker's own key, as its agent set it (None: a job without keys, in tests of parts)."""
    text = env.get(WORKER_KEY_ENV)
    if not text:
        return None
    try:
        return Credentials(Identity(WORKER, host, worker_id), parse_key(text, f"${WORKER_KEY_ENV}"))
    except ValueError as exc:
        raise UsageError(f"{exc}; this worker was not started by a ringmaster agent") from None


class WorkerContext:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ if environ is None else environ)
        self.address = env.get(env_names.RENDEZVOUS)
        self.worker_id = env.get(env_names.WORKER_ID, "local")
        self.host = env.get(env_names.HOST, "localhost")
        self.start_generation = int(env.get(env_names.GENERATION, "0"))
        self.timeout_s = float(env.get(env_names.COLLECTIVE_TIMEOUT, DEFAULT_COLLECTIVE_TIMEOUT_S))
        #: "nccl" adds an NCCL ring for CUDA tensors beside the Gloo ring (default when CUDA is present).
        self.backend = env.get(env_names.BACKEND) or ("nccl" if torch.cuda.is_available() else "gloo")
        self._tentative = (
            int(env.get(env_names.TORCHRUN_RANK, "0")),
            int(env.get(env_names.TORCHRUN_WORLD_SIZE, "1")),
            int(env.get(env_names.TORCHRUN_LOCAL_RANK, "0")),
        )
        #: The rendezvous started this worker into a running job and told it its likely place
        #: (`tentative_rank_env`); a worker of a job's first ring is told nothing before it.
        self.tentative_given = env_names.TORCHRUN_WORLD_SIZE in env
        #: The GPU of this process for its whole life: its slot on the host (the LOCAL_RANK it was
        #: started with). Its local rank may change between generations; its tensors do not move.
        self.device_index = self._tentative[2]
        self.link: RendezvousLink | None = None
        #: What this worker did so far (commits, syncs, rollbacks, checkpoints, loss), sent with heartbeats.
        self.figures = WorkerFigures()
        #: Its timeline spans (`--timeline`), sent with heartbeats; off unless the job has a timeline.
        self.spans = SpanRecorder(on=env.get(TIMELINE_SPANS_ENV) == "1")
        if self.address:
            self.link = RendezvousLink(
                self.address, self.worker_id, self.host, float(env.get(env_names.HEARTBEAT_INTERVAL, "1.0")),
                float(env.get(env_names.RECONNECT_TIMEOUT, DEFAULT_RECONNECT_TIMEOUT_S)),
                credentials=_credentials(env, self.worker_id, self.host),
                ca_pem=env[TLS_CA_ENV].encode() if env.get(TLS_CA_ENV) else None,
                stats=self.figures.stats, spans=self.spans,
            )
        self._store_address = env.get(env_names.STORE)
        self.store: dist.Store | None = None
        self._store_at: tuple[str, int] | None = None
        self._gloo_device: object | None = None  # bound to the address the other hosts reach
        self.assignment: pb.Assignment | None = None
        self.comm: Communicator | None = None
        self._graveyard: list[Communicator] = []  # old rings with a collective stuck; see _retire_ring
        self.commits = 0
        self._missed_generation = 0  # the generation it was started for, if that ended before it joined
        self._first_commit_reported = -1  # the generation whose first commit was reported at once
        #: seconds of the last join: (waiting for the assignment, building the ring)
        self.last_join_s: tuple[float, float] = (0.0, 0.0)
        self._last_step: tuple[float, int] | None = None  # (perf_counter, generation) of the last step

    # ------------------------------------------------------------ start
    def init(self) -> None:
        if self.link is None:
            self._join_alone()
            return
        shield_from_host_signals()  # a SIGTERM to the whole host is its agent's drain, not this worker's end
        exiting.fatal_reporter = self.report_fatal
        host, port = self._store_address.rsplit(":", 1)  # type: ignore[union-attr]
        self._connect_store(host, int(port))
        self._guard(self.link.start)
        if self.start_generation > 0:
            self._guard(self._join_planned)

    def _join_planned(self) -> None:
        """Join the generation this worker was started for; if it ended before this worker got
        there (a peer failed while this one was still starting), go on without a ring, as a
        newcomer: `hvd.elastic.run` (or the first collective) asks for a place in the next one.
        An elastic job never fails, or waits on, a member only because it was slow to start."""
        assert self.link is not None
        generation = self.start_generation
        if self.link.wait_planned(generation) is None:
            self._missed_generation = generation  # (its Ready asks for a generation after it)
            say(Kind.PLANNED_GENERATION_MISSED, generation, reason=self.link.generation_over(generation) or "")
            return
        self._join(generation - 1, first_ready=False)

    def _join_alone(self) -> None:
        store = dist.HashStore()
        self.assignment = pb.Assignment(generation=1, rank=0, size=1, local_rank=0, local_size=1, cross_rank=0,
                                        cross_size=1)
        pg = dist.ProcessGroupGloo(store, 0, 1, timedelta(seconds=self.timeout_s))
        self.comm = Communicator(pg, 0, 1, 1, None, self.timeout_s)

    # ------------------------------------------------------------ membership
    def enter_elastic(self) -> None:
        """Called by `hvd.elastic.run`: from now on this worker can rejoin in place."""
        if self.link is None:
            return
        if not self.link.elastic:
            self.link.elastic = True
            self.link.heartbeat_now()
        if self.comm is None:
            self.rejoin("")

    def rejoin(self, failure: str) -> None:
        """Leave the current ring (if any) and join the next generation."""
        if self.link is None:
            return
        after = self.assignment.generation if self.assignment else self._missed_generation
        self._guard(lambda: self._join(after, first_ready=True, failure=failure))

    def _join(self, after: int, first_ready: bool, failure: str = "") -> None:
        assert self.link is not None
        self._retire_ring()
        started, started_us = time.perf_counter(), now_us()
        if first_ready:
            self.link.ready(after, failure)
        while True:
            assignment = self.link.wait_assignment(after)
            assigned, assigned_us = time.perf_counter(), now_us()
            try:
                try:
                    self._build(assignment)
                finally:
                    self.spans.add(pb.SPAN_WAITING, started_us, assigned_us)
                    self.spans.add(pb.SPAN_RING_BUILD, assigned_us, now_us())
                self.last_join_s = (assigned - started, time.perf_counter() - assigned)
                return
            except HorovodInternalError as exc:
                started_us = now_us()
                say(Kind.RING_JOIN_FAILED, assignment.generation, error=str(exc))
                after = assignment.generation
                self.link.ready(after, str(exc))

    def _connect_store(self, host: str, port: int) -> None:
        self.store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=max(self.timeout_s, 60)))
        self._store_at = (host, port)
        self._gloo_device = gloo_device(host)

    def _build(self, a: pb.Assignment) -> None:
        assert self.link is not None and self.store is not None
        if a.store_port and (a.store_host, a.store_port) != self._store_at:
            self._connect_store(a.store_host, a.store_port)  # a restarted or standby rendezvous hosts a new one
        def ring(backend: str) -> dist.ProcessGroup:
            return build_process_group(
                self.store, a.store_prefix, a.rank, a.size, self.timeout_s, backend,  # type: ignore[arg-type]
                lambda: self.link.generation_over(a.generation), self.link,  # type: ignore[union-attr]
                self._gloo_device if backend == "gloo" else None,
            )

        pg = ring("gloo")
        cuda_pg = None
        refusal = None
        if self.backend == "nccl":
            torch.cuda.set_device(self.device_index % torch.cuda.device_count())
            # (a host's workers all decide alike. Where another host has GPUs enough, its workers build
            # their NCCL ring; their CUDA collectives then fail at the collective timeout, bounded.)
            refusal = nccl_refusal(self.host, a.local_size, torch.cuda.device_count())
            cuda_pg = ring("nccl") if refusal is None else None

        def subring(ranks: tuple[int, ...]) -> tuple[dist.ProcessGroup, dist.ProcessGroup | None]:
            """A process set's rings: its members meet under a prefix that names the set."""
            prefix = f"{a.store_prefix}set-{'-'.join(map(str, ranks))}/"
            build = lambda backend: build_process_group(  # noqa: E731
                self.store, prefix, ranks.index(a.rank), len(ranks), self.timeout_s, backend,  # type: ignore[arg-type]
                lambda: self.link.generation_over(a.generation), self.link,  # type: ignore[union-attr]
                self._gloo_device if backend == "gloo" else None)
            return build("gloo"), build("nccl") if cuda_pg is not None else None

        self.assignment = a
        self.spans.place = (a.rank, a.generation)
        self.comm = Communicator(pg, a.rank, a.size, a.generation, self.link, self.timeout_s, cuda_pg, subring,
                                 cuda_refusal=refusal)

    def _retire_ring(self) -> None:
        """Drop the current ring before the next is built.

        An old group left alive slows the construction of the next one (measured: 2 ms becomes
        20-40 ms, with 5 s outliers at 8 ranks), so an idle group is destroyed at once. A Gloo
        group with a collective stuck on a hung peer would block its destructor until the Gloo
        timeout, so such a group is kept until its collective has failed. NCCL groups are
        aborted so their kernels cannot hang the device.
        """
        self._graveyard = [old for old in self._graveyard if not old.idle]
        if self.comm is None:
            return
        self.comm.close("the worker left the ring")
        self.comm.abort()
        if not self.comm.idle:
            self._graveyard.append(self.comm)
        self.comm = None

    def _guard(self, action) -> None:
        """Turn the rendezvous' 'leave' verdicts into a clean process exit (`leave`)."""
        try:
            action()
        except Retired as exc:
            say(Kind.WORKER_LEAVING, reason=str(exc))
            leave(0)
        except JobEnded as exc:
            say(Kind.WORKER_JOB_ENDED, reason=str(exc))
            leave(0 if exc.success else 1)
        except ConnectionError as exc:
            say(Kind.WORKER_ERROR, error=str(exc))
            leave(1)
        except grpc.RpcError as exc:
            say(Kind.LINK_UNREACHABLE, address=self.address, code=exc.code().name)
            leave(1)

    # ------------------------------------------------------------ facts for the hvd API
    def hosts_sequence_baseline(self) -> int:
        return self.assignment.hosts_sequence if self.assignment else 0

    def topology(self) -> tuple[int, int, int, int, int, int]:
        """(rank, size, local_rank, local_size, cross_rank, cross_size); tentative for a newcomer."""
        a = self.assignment
        if a is None:
            rank, size, local_rank = self._tentative
            return rank, size, local_rank, 1, 0, 1
        return a.rank, a.size, a.local_rank, a.local_size, a.cross_rank, a.cross_size

    def communicator(self) -> Communicator:
        if self.comm is None:
            if self.link is not None:
                self.rejoin("")
        assert self.comm is not None
        return self.comm

    def note_commit(self, commits: int, new: bool = False, received: bool = False) -> None:
        """The state's commit count (it goes back on a rollback), reported with heartbeats. The
        first new commit in a generation is reported at once: it is when training resumed after a
        reset (the rendezvous measures recovery by it), and it is the first step `status` can count
        (the count a reset's sync restores is not news). A commit `received` from rank 0 by a sync
        is reported at once too: from then on this worker holds the job's last commit, which the
        rendezvous must know if every worker that held it before dies."""
        self.commits = commits
        if self.link is not None:
            self.link.commits = self.commits
            self.link.steps_since_commit = 0  # (committed, restored or synced: nothing to undo)
            generation = self.assignment.generation if self.assignment is not None else 0
            if received:
                self.link.beat_soon()
            elif new and generation != self._first_commit_reported:
                self._first_commit_reported = generation
                self.link.beat_soon()

    def note_step(self, waited_s: float = 0.0) -> None:
        """The wrapped optimizer stepped (`waited_s` of it waiting for the ring's reduction): one
        more step that a rollback before the next commit undoes (the rendezvous says what a
        drain's missed deadline cost with it), timed from the step before in the same ring (the
        pool fits the job's scaling to these; a straggler shows as the rank that waits least)."""
        if self.link is not None:
            self.link.steps_since_commit += 1
        now = time.perf_counter()
        ring = self.comm.generation if self.comm is not None else 0
        if self._last_step is not None and self._last_step[1] == ring:
            self.figures.step(now - self._last_step[0], waited_s)
        self._last_step = (now, ring)

    def report_done(self, warning: str = "") -> None:
        if self.link is not None:
            self._guard(lambda: self.link.report_done(warning))

    def report_fatal(self, cause: str) -> None:
        """The job cannot go on, for a cause of its own (`JobFatalError`): the rendezvous ends it
        with `cause` and blames no host. Called as the script ends; the rendezvous' answer (the job
        ended) changes nothing here."""
        if self.link is not None:
            try:
                self.link.report_done(fatal=cause)
            except (JobError, ConnectionError, grpc.RpcError):
                pass

    def shutdown(self) -> None:
        """Leave the job's rings and the rendezvous cleanly. Runs at interpreter exit too
        (`hvd.init` registers it with `atexit`, which runs before the interpreter finalizes):
        a gRPC stream torn down or a collective completing after that point wakes a thread that
        can no longer enter Python, and the process dies by SIGABRT ("terminate called without
        an active exception") instead of exiting with its script's status.

        The session closes first, the ring after: a crashed worker's closed session is how the
        rendezvous learns that this worker failed (and waits for its exit status). Torn down
        first, the ring would let the peers report "connection closed by peer" while this
        worker's session still stood, and the next ring would be formed with this worker in it
        (a second reset when its session closed)."""
        if self.link is not None:
            self.link.close()
        self._retire_ring()
        deadline = time.monotonic() + self.timeout_s
        while self._graveyard and time.monotonic() < deadline:  # collectives stuck on a hung peer end by its timeout
            self._graveyard = [old for old in self._graveyard if not old.idle]
            time.sleep(0.01)
        self._graveyard = []
