"""Scale harness: a real `ringmaster serve` against thousands of simulated hosts.

Each host is an agent and `--slots` workers speaking the real gRPC protocol with real keys
(`tests/simulated_fleet.py`, asyncio clients packed into `--fleets` processes); the rendezvous
finds its hosts with a discovery script reading a file, as a user's would. For each size:

- the first generation: from the rendezvous' start until every worker holds its assignment;
- steady state over `--steady-s` seconds: the rendezvous' own CPU (a fraction of one core) and
  memory (RSS), the calls the simulated hosts made, `/status` and `/metrics` latency;
- three membership changes, each timed from the change until every worker holds its assignment
  in the new generation (the simulated workers stamp it): a host lost (its streams closed, as a
  machine that dies), 64 hosts added at once (the discovery file), a scale-down by half (half the
  hosts leave discovery); and, in brackets, until the last of those assignments left the
  rendezvous (it stamps that itself, `/status`' generations): the rendezvous' own part, apart from
  the simulated workers taking them in on the same cores; the rendezvous' CPU seconds over the
  change; and for growth and shrinking, the survivors' longest pause (from a worker's stop at its
  commit in the old generation to its place in the new: training goes on until then);
- with `--store etcd`, the bytes and writes etcd took per generation (its own metrics).

`--messages both` runs each size twice: with the agents carrying the workers' messages (one
message per host, `ringmaster/common/event_relay.py`) and with every worker hearing its own
stream (one message per worker), the baseline in the same run.

The rendezvous shares this machine with the simulated hosts: its own CPU is what is reported.

`--part control` times the rendezvous' decisions alone (its coordinator, in this process, no
gRPC): what one clock tick, one status view, one save of the job's record and each step of a
host loss cost at each size, which is where a change spends its time before any message.

Run: python bench/scale.py [--part wire|control] [--hosts 512,2048,4096] [--slots 8] [--store memory|etcd|both]
     [--rounds N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Iterator

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from harness import API_HEADERS, SECRET, free_port, wait_for  # noqa: E402
from simulated_fleet import FleetProcess  # noqa: E402
from simulated_hosts import cpu_seconds  # noqa: E402

from ringmaster.worker.agent.starting.spare_pool import rss_bytes  # noqa: E402

#: Hosts added at once in the growth change.
ADDED_HOSTS = 64


@dataclass
class Change:
    """One membership change as measured."""

    what: str
    seconds: float  # from the change until every worker held its assignment in the new generation
    out_s: float  # from the change until the last of those assignments left the rendezvous (its stamp)
    generation: int
    workers: int
    server_cpu_s: float
    pause_s: float = 0.0  # a survivor's longest pause: from its stop in the old generation to its new place
    etcd: dict[str, float] = field(default_factory=dict)


class Cluster:
    """A rendezvous and its simulated hosts (`hosts` x `slots`), the hosts listed in a file that
    its discovery script prints."""

    def __init__(self, root: pathlib.Path, hosts: int, slots: int, store: str, fleets: int,
                 heartbeat_s: float, discovery_s: float, extra: list[str] | None = None,
                 carry_events: bool = True) -> None:
        """`carry_events`: the simulated agents carry a large job's messages to their workers, as
        `ringmaster agent` does (else every worker hears its own stream: the way before it)."""
        self.root, self.slots, self.store = root, slots, store
        self.carry_events = carry_events
        self.names = [f"h{i:05d}" for i in range(hosts)]
        self.hosts_file = root / "hosts.txt"
        self.script = root / "hosts.sh"
        self.script.write_text(f"#!/bin/sh\nexec cat {self.hosts_file}\n")
        self.script.chmod(0o755)
        self.port, self.api_port = free_port(), free_port()
        self.heartbeat_s, self.discovery_s = heartbeat_s, discovery_s
        self.extra = extra or []
        self.fleet_count = fleets
        self.fleets: list[FleetProcess] = []
        self.proc: subprocess.Popen | None = None
        self.log = root / "serve.log"
        self.first_timeout_s = 600.0
        self.change_timeout_s = 300.0

    def write_hosts(self, names: list[str]) -> None:
        tmp = self.hosts_file.with_suffix(".tmp")
        tmp.write_text("".join(f"{n}:{self.slots}\n" for n in names))
        tmp.replace(self.hosts_file)

    def start(self) -> float:
        """Start everything; seconds until every worker holds an assignment (the first generation)."""
        self.write_hosts(self.names)
        started = time.monotonic()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ringmaster.cli", "serve", "--host-discovery-script", str(self.script),
                 "--min-np", "1", "--port", str(self.port), "--api-port", str(self.api_port), "--store", self.store,
                 "--discovery-interval", str(self.discovery_s), "--heartbeat-interval", str(self.heartbeat_s),
                 "--start-timeout", "600", "--warmup-grace", "600", "--elastic-timeout", "600",
                 "--log-level", "ERROR", *self.extra, "python", "-c", "pass"],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        address = f"127.0.0.1:{self.port}"
        wait_for(lambda: self._listening(), 60, f"the rendezvous to listen on {address}")
        self.fleets = [FleetProcess(address, SECRET, self.heartbeat_s,
                                    self.carry_events) for _ in range(self.fleet_count)]
        self.add(self.names)
        self.wait_settled(len(self.names) * self.slots, 0, self.first_timeout_s, "the first generation")
        return self.last_assigned() - started

    def _listening(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the rendezvous exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}")
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def _fleet_of(self, name: str) -> FleetProcess:
        return self.fleets[int(name[1:]) % len(self.fleets)]

    def _by_fleet(self, names: list[str]) -> Iterator[tuple[FleetProcess, list[str]]]:
        for fleet in self.fleets:
            mine = [n for n in names if self._fleet_of(n) is fleet]
            if mine:
                yield fleet, mine

    def add(self, names: list[str]) -> None:
        for fleet, mine in self._by_fleet(names):
            fleet.ask("add", mine, self.slots)

    def kill(self, names: list[str]) -> None:
        for fleet, mine in self._by_fleet(names):
            fleet.ask("kill", mine)

    def take_marks(self) -> dict[str, tuple[float, float]]:
        """When the simulated hosts saw each step of the change under way, first and last
        (time.monotonic), since this was last asked."""
        marks: dict[str, tuple[float, float]] = {}
        for fleet in self.fleets:
            for step, (first, last) in fleet.ask("take_marks").items():
                seen = marks.get(step)
                marks[step] = (first, last) if seen is None else (min(seen[0], first), max(seen[1], last))
        return marks

    def summaries(self) -> list[dict[str, Any]]:
        return [fleet.ask("summary") for fleet in self.fleets]

    def wait_settled(self, workers: int, after_generation: int, timeout_s: float, what: str) -> int:
        """Wait until exactly `workers` workers run, all in one generation newer than
        `after_generation`; that generation."""

        def settled() -> int | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the rendezvous exited ({self.proc.returncode}); see {self.log}")
            s = self.summaries()
            low, high = min(x["min_generation"] for x in s), max(x["max_generation"] for x in s)
            if sum(x["workers"] for x in s) == workers and low == high > after_generation:
                return high
            return None

        # (each look walks every simulated worker in the client processes, which share the cores
        # with the rendezvous: at 0.05 s it was a seventh of their time in a change at 4,096 x 8;
        # the times measured are the workers' own stamps, not when a look found them)
        try:
            return wait_for(settled, timeout_s, f"{what}: {workers} workers in one new generation", interval_s=0.25)
        except AssertionError as exc:  # (what the simulated hosts saw go wrong, with it)
            seen = [{k: x[k] for k in ("workers", "hosts", "refused", "last_refusal", "session_errors")}
                    for x in self.summaries()]
            raise AssertionError(f"{exc}; the simulated hosts: {seen}") from None

    def last_assigned(self) -> float:
        return max(x["last_assigned"] for x in self.summaries())

    def assignments(self) -> list[tuple[str, str, int, int, int]]:
        return [row for fleet in self.fleets for row in fleet.ask("assignments")]

    def get(self, path: str) -> tuple[float, int]:
        """Seconds a GET of the control API took, and the body's size."""
        started = time.perf_counter()
        size = len(self.read(path))
        return time.perf_counter() - started, size

    def read(self, path: str) -> bytes:
        request = urllib.request.Request(f"http://127.0.0.1:{self.api_port}{path}", headers=API_HEADERS)
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.read()

    def assignments_out_at(self, generation: int) -> float:
        """When (seconds since the epoch) the rendezvous wrote the last of `generation`'s assignments."""

        def stamped() -> float | None:
            entries = json.loads(self.read("/status?limit=1"))["generations"]
            return next((e["assigned_at"] for e in entries if e["number"] == generation and e["assigned_at"]), None)

        return wait_for(stamped, 30, f"the rendezvous' stamp of generation {generation}'s assignments")

    def close(self) -> None:
        for fleet in self.fleets:
            fleet.close()
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def etcd_counters(client_port: int) -> dict[str, float]:
    """etcd's own count of puts and transactions and of the bytes its clients sent it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{client_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    wanted = {"etcd_mvcc_put_total": "puts", "etcd_mvcc_txn_total": "txns", "etcd_mvcc_delete_total": "deletes",
              "etcd_network_client_grpc_received_bytes_total": "bytes_in"}
    found = dict.fromkeys(wanted.values(), 0.0)
    for line in text.splitlines():
        match = re.match(r"^(\w+)(?:\{[^}]*\})? ([0-9.e+]+)$", line)
        if match and match.group(1) in wanted:
            found[wanted[match.group(1)]] += float(match.group(2))
    return found


def check_assignments(rows: list[tuple[str, str, int, int, int]], workers: int, generation: int) -> None:
    """Every worker assigned exactly once, ranks 0..N-1, one size, one generation, each host's
    workers on consecutive ranks."""
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)) == workers, (len(ids), len(set(ids)), workers)
    assert {r[2] for r in rows} == {generation}, {r[2] for r in rows}
    assert sorted(r[3] for r in rows) == list(range(workers)), "ranks are not 0..N-1"
    assert {r[4] for r in rows} == {workers}, {r[4] for r in rows}
    by_host: dict[str, list[int]] = {}
    for _, host, _, rank, _ in rows:
        by_host.setdefault(host, []).append(rank)
    for host, ranks in by_host.items():
        ranks.sort()
        assert ranks == list(range(ranks[0], ranks[0] + len(ranks))), (host, ranks)


def run_changes(cluster: Cluster, etcd_port: int | None = None, check: bool = True) -> list[Change]:
    """Host lost, hosts added, scale-down by half, each measured (and checked with `check`)."""
    changes = []
    names = list(cluster.names)
    generation = cluster.wait_settled(len(names) * cluster.slots, 0, 60, "before the changes")

    def measure(what: str, act, expected_hosts: list[str]) -> None:
        nonlocal generation
        before = etcd_counters(etcd_port) if etcd_port else {}
        cluster.take_marks()  # (those of the change before)
        cpu = cpu_seconds(cluster.proc.pid)  # type: ignore[union-attr]
        started, wall = time.monotonic(), time.time()
        act()
        workers = len(expected_hosts) * cluster.slots
        new = cluster.wait_settled(workers, generation, cluster.change_timeout_s, what)
        elapsed = cluster.last_assigned() - started
        out = cluster.assignments_out_at(new) - wall
        used = cpu_seconds(cluster.proc.pid) - cpu  # type: ignore[union-attr]
        after = etcd_counters(etcd_port) if etcd_port else {}
        per_generation = {k: (after[k] - before[k]) / max(1, new - generation) for k in after}
        if check:
            rows = cluster.assignments()
            check_assignments(rows, workers, new)
            assert {r[1] for r in rows} == set(expected_hosts), what
        pause = max(x["longest_pause"] for x in cluster.summaries())
        steps = cluster.take_marks()
        changes.append(Change(what, elapsed, out, new, workers, used, pause, per_generation))
        print(f"# {len(cluster.names)} hosts: {what} in {elapsed:.2f} s, out of the rendezvous in {out:.2f} s "
              f"(serve CPU {used:.2f} s; survivors' longest pause {pause:.2f} s)", file=sys.stderr,
              flush=True)  # (as it comes: a later change that times out keeps this one)
        print("#   seen by the hosts, seconds after the change (first-last): " + "; ".join(
            f"{step} {first - started:.2f}-{last - started:.2f}" for step, (first, last) in steps.items()),
            file=sys.stderr, flush=True)
        generation = new

    lost = names[-1]
    names = names[:-1]
    measure("host lost", lambda: cluster.kill([lost]), names)
    added = [f"h{i:05d}" for i in range(len(cluster.names), len(cluster.names) + ADDED_HOSTS)]

    grown = names + added

    def grow() -> None:
        cluster.write_hosts(grown)
        cluster.add(added)

    names = grown
    measure(f"{ADDED_HOSTS} hosts added", grow, names)
    kept = names[:len(names) // 2]
    measure("scale-down by half", lambda: cluster.write_hosts(kept), kept)
    return changes


#: Seconds after the first generation settled before the steady state is measured: its aftermath
#: (the record written to the store, the heap frozen 2 s after it formed) is no steady state
#: (measured at 4,096 x 8 with etcd: 0.76 cores from the moment it settled, 0.42 from 8 s later).
AFTERMATH_S = 10.0


def steady_state(cluster: Cluster, seconds: float, aftermath_s: float = AFTERMATH_S) -> dict[str, float]:
    """The rendezvous' CPU (cores) and RSS and the simulated hosts' call rate over `seconds` of a
    job that is not changing and that nobody reads (from AFTERMATH_S after it settled); then, over
    as long again, the control API's latency and the CPU with `/status` and `/metrics` each read
    once a second (a dashboard's pace)."""
    time.sleep(aftermath_s)  # (a benchmark's pause, not a test's wait: nothing to wait for but time)
    pid = cluster.proc.pid  # type: ignore[union-attr]
    calls_before = sum(x["calls"] for x in cluster.summaries())
    cpu_before, started = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)  # (the measured interval itself: the job runs on its own meanwhile)
    elapsed = time.monotonic() - started
    calls = sum(x["calls"] for x in cluster.summaries()) - calls_before
    quiet_cores = (cpu_seconds(pid) - cpu_before) / elapsed
    status, metrics = [], []
    status_bytes = metrics_bytes = 0
    cpu_before, started = cpu_seconds(pid), time.monotonic()
    while time.monotonic() - started < seconds:
        took, status_bytes = cluster.get("/status")
        status.append(took)
        took, metrics_bytes = cluster.get("/metrics")
        metrics.append(took)
        time.sleep(max(0.0, min(1.0, seconds - (time.monotonic() - started))))  # (a reader's pace)
    read_cores = (cpu_seconds(pid) - cpu_before) / (time.monotonic() - started)
    return {"cpu_cores": quiet_cores, "read_cores": read_cores, "rss_mb": rss_bytes(pid) / 2**20,
            "calls_per_s": calls / elapsed, "status_ms": statistics.median(status) * 1e3,
            "status_kb": status_bytes / 1024, "metrics_ms": statistics.median(metrics) * 1e3,
            "metrics_kb": metrics_bytes / 1024}


def control_costs(hosts: int, slots: int) -> dict[str, float]:
    """Seconds the coordinator itself takes (`--part control`), at `hosts` x `slots`."""
    from ringmaster.rendezvous.control.coordinator import Coordinator, RingStoreAddress
    from ringmaster.rendezvous.server.heap import LongLivedHeap
    from ringmaster.rendezvous.state import job_record
    from ringmaster.settings import JobSettings

    settings = JobSettings(command=["python", "train.py"], min_np=1, start_timeout_s=600, warmup_grace_s=600)
    c = Coordinator(settings, "127.0.0.1:1", RingStoreAddress("127.0.0.1", 2), lambda g: ("127.0.0.1", 1000 + g))
    names = {f"h{i:05d}": slots for i in range(hosts)}
    costs: dict[str, float] = {}

    def timed(what: str, action) -> None:
        started = time.process_time()
        action()
        costs[what] = time.process_time() - started

    def first() -> None:
        c.set_hosts(names, 0.0)
        for i, name in enumerate(names):
            c.agent_connected(name, 100 + i, 0.0)
        c.settle(0.0)
        c.drain()
        for a in c.generation.members:  # type: ignore[union-attr]
            c.worker_connected(a.worker_id, 1, 0.0)
            c.worker_heartbeat(a.worker_id, 0, True, 0.0)
        c.settle(0.0)
        c.drain()

    timed("first generation", first)
    LongLivedHeap().settled(1, hosts * slots)  # (the heap kept as `serve` keeps it: else the collector's
    # full passes over a few million objects land in whichever step comes next, 0.3 s at 4,096 x 8)
    snapshots = job_record.Snapshots()
    timed("record (first save)", lambda: job_record.job_values(c.saved(), snapshots))
    timed("record (unchanged)", lambda: job_record.job_values(c.saved(), snapshots))
    lost = list(names)[-1]
    survivors: list[str] = []

    def tick() -> None:
        c.tick(0.2)
        c.drain()

    def failure() -> None:
        c.agent_disconnected(lost, 0.3)
        c.settle(0.3)
        c.drain()

    def ready() -> None:
        for worker_id in survivors:
            c.worker_ready(worker_id, 1, "peer died", True, 0.3)

    timed("tick", tick)
    timed("status view", lambda: c.view(0.2))
    survivors += [a.worker_id for a in c.generation.members if a.host != lost]  # type: ignore[union-attr]
    timed("host lost: the failure and the next generation", failure)
    assert c.generation is not None and c.generation.number == 2 and len(c.generation.members) == len(survivors)
    timed("host lost: the survivors' late Ready (answered)", ready)
    timed("host lost: a pass after them", lambda: (c.settle(0.3), c.drain()))
    assert c.generation.number == 2
    timed("record (after the change)", lambda: job_record.job_values(c.saved(), snapshots))
    added = {f"h{i:05d}": slots for i in range(hosts, hosts + ADDED_HOSTS)}

    def discovered() -> None:
        c.set_hosts({**names, **added}, 0.4)
        c.settle(0.4)
        c.drain()

    def connected() -> None:
        for i, name in enumerate(list(added)[:8]):
            c.agent_connected(name, 9000 + i, 0.5)
        c.settle(0.5)
        c.drain()

    timed(f"{ADDED_HOSTS} hosts discovered: the pass after", discovered)
    timed("8 of their agents connect: newcomers started, announced", connected)
    assert sum(1 for w in c.workers.values() if w.host in added) == 8 * slots
    timed("the clock's pass while they warm up", tick)

    def all_ready() -> None:
        for i, name in enumerate(list(added)[8:]):
            c.agent_connected(name, 9100 + i, 0.6)
        c.settle(0.6)
        c.drain()
        for w in [w for w in c.workers.values() if w.host in added]:
            c.worker_connected(w.worker_id, 1, 0.6)
            c.worker_ready(w.worker_id, 0, "", True, 0.6)
        c.settle(0.6)
        c.drain()

    def reported() -> None:
        gen = c.generation
        assert gen is not None and gen.update_reporter
        c.worker_ready(gen.update_reporter, gen.number, "", True, 0.7)
        c.settle(0.7)
        c.drain()

    timed(f"all {ADDED_HOSTS} hosts' newcomers ready: the host update", all_ready)
    assert c.generation is not None and c.generation.update_sequence
    timed("the update's commit reported: the next generation", reported)
    assert c.generation.number == 3 and len(c.generation.members) == (hosts + ADDED_HOSTS - 1) * slots
    names = {**names, **added}

    def rack_lost() -> None:
        for name in list(names)[len(names) // 2:]:
            c.agent_disconnected(name, 0.8)
        c.settle(0.8)
        c.drain()

    timed("half the hosts lost at once (a rack): the pass", rack_lost)
    kept = [name for name in list(names)[:len(names) // 2] if name != lost]
    assert c.generation is not None and len(c.generation.members) == len(kept) * slots
    return costs


def control_table(sizes: list[int], slots: int) -> None:
    rows = {hosts: control_costs(hosts, slots) for hosts in sizes}
    steps = list(next(iter(rows.values())))
    print("## The coordinator alone: CPU seconds per step (no gRPC, no store)\n")
    print("| step | " + " | ".join(f"{h} x {slots}" for h in sizes) + " |")
    print("| --- |" + " --- |" * len(sizes))
    for step in steps:
        print(f"| {step} | " + " | ".join(f"{rows[h][step]:.3f}" for h in sizes) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["wire", "control"], default="wire",
                        help="wire: a real rendezvous and simulated hosts; control: its decisions alone")
    parser.add_argument("--hosts", default="512,2048,4096", help="sizes, comma-separated")
    parser.add_argument("--slots", type=int, default=8, help="workers per host")
    parser.add_argument("--store", choices=["memory", "etcd", "both"], default="both")
    parser.add_argument("--fleets", type=int, default=2, help="processes the simulated hosts share")
    parser.add_argument("--heartbeat-interval", type=float, default=1.0, help="the rendezvous' --heartbeat-interval")
    parser.add_argument("--discovery-interval", type=float, default=0.5)
    parser.add_argument("--steady-s", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="clusters measured per size and store, each its own row, then the changes' medians "
                             "(one run varies by about a second at 4,096 x 8 on 2 cores)")
    parser.add_argument("--messages", choices=["carried", "streamed", "both"], default="carried",
                        help="a large job's messages to workers: carried by the agents, one per host (as "
                             "`ringmaster agent` does), or on every worker's own stream")
    args = parser.parse_args()
    sizes = [int(x) for x in args.hosts.split(",")]
    if args.part == "control":
        control_table(sizes, args.slots)
        return
    stores = ["memory", "etcd"] if args.store == "both" else [args.store]
    print(f"# Scale: {args.slots} workers per host, {args.fleets} client processes, heartbeat "
          f"{args.heartbeat_interval:g} s, discovery every {args.discovery_interval:g} s, {os.cpu_count()} cores\n")
    ways = ["carried", "streamed"] if args.messages == "both" else [args.messages]
    print("| hosts | workers | store | messages | first gen. s | host lost s (out; CPU s) | +64 hosts s (out; CPU s; "
          "pause s) | half s (out; CPU s; pause s) | serve CPU (cores; read) "
          "| RSS MB | calls/s | /status ms (KB) | /metrics ms (KB) | etcd KB / gen. (lost, +64, half) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for hosts, store, way in ((h, s, w) for h in sizes for s in stores for w in ways):
        runs = [measure_size(args, hosts, store, way) for _ in range(args.rounds)]
        if len(runs) > 1:
            print(f"| {hosts} | {hosts * args.slots} | {store} | {way}, median of {len(runs)} | "
                  f"{statistics.median(r[0] for r in runs):.2f} | "
                  + " | ".join(f"{statistics.median(r[1][i].seconds for r in runs):.2f} "
                               f"(CPU {statistics.median(r[1][i].server_cpu_s for r in runs):.2f})"
                               for i in range(len(runs[0][1])))
                  + f" | {statistics.median(r[2]['cpu_cores'] for r in runs):.2f} | | | | | |", flush=True)


def measure_size(args: argparse.Namespace, hosts: int, store: str,
                 way: str) -> tuple[float, list[Change], dict[str, float]]:
    """One cluster of `hosts` measured (its row printed): the first generation, the steady
    state and the changes."""
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        etcd = None
        url = "memory"
        if store == "etcd":
            from etcd_server import EtcdServer
            etcd = EtcdServer(root / "etcd").start()
            url = f"etcd://127.0.0.1:{etcd.client_port}/scale/{hosts}"
        cluster = Cluster(root, hosts, args.slots, url, args.fleets, args.heartbeat_interval,
                          args.discovery_interval, carry_events=way == "carried")
        try:
            first = cluster.start()
            steady = steady_state(cluster, args.steady_s)
            changes = run_changes(cluster, etcd.client_port if etcd else None)
        finally:
            cluster.close()
            if etcd is not None:
                etcd.kill()
    etcd_kb = ", ".join(f"{c.etcd.get('bytes_in', 0) / 1024:.0f}" for c in changes) if etcd else "-"
    print(f"| {hosts} | {hosts * args.slots} | {store} | {way} | {first:.2f} | "
          + " | ".join(f"{c.seconds:.2f} ({c.out_s:.2f}; {c.server_cpu_s:.2f}"
                       + (f"; {c.pause_s:.2f})" if i else ")") for i, c in enumerate(changes))
          + f" | {steady['cpu_cores']:.2f}; {steady['read_cores']:.2f} | {steady['rss_mb']:.0f} | "
            f"{steady['calls_per_s']:.0f} | "
          f"{steady['status_ms']:.0f} ({steady['status_kb']:.0f}) | {steady['metrics_ms']:.0f} "
          f"({steady['metrics_kb']:.0f}) | {etcd_kb} |", flush=True)
    return first, changes, steady

if __name__ == "__main__":
    main()
