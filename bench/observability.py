"""What seeing a job costs: step time with and without the workers' figures (metrics) and the
timeline, the timeline's size per 1000 steps, and the cost of a /metrics scrape.

Each run is a real `ringmaster run -np 2` (Gloo, one thread per rank) of an elastic training
loop: zero_grad, forward, backward, `DistributedOptimizer.step()`, `state.commit()` every step.
Three ways, in the same run of this script:
  - bare: the workers' figures replaced by a stand-in that records nothing, no timeline;
  - metrics: as a job runs by default (figures recorded at every commit and sync, sent with
    every heartbeat, `GET /metrics` scraped once a second during the run);
  - metrics + timeline: with `--timeline FILE` as well (spans for forward, backward, each
    bucket's allreduce, optimizer step and commit, sent with heartbeats, written by the rendezvous).
Median ms per step over the timed steps (after warm-up), and the ratio to bare. Models: a tiny
MLP (per-step overhead shows most), an MLP of 1.3 M parameters.

Run: python bench/observability.py [--steps 400] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
WARMUP = 20
MODELS = {"mlp-tiny": (64, 2), "mlp-1.3m": (800, 2)}


class _NoFigures:
    """Stands in for the worker's figures in the bare runs: records nothing, sends empty stats."""

    checkpoints = staticmethod(lambda: (0, 0, 0))

    def commit(self, seconds: float) -> None: ...
    def sync(self, seconds: float) -> None: ...
    def rollback(self) -> None: ...
    def report(self, loss: float) -> None: ...

    def stats(self) -> Any:
        from ringmaster.proto import ringmaster_pb2 as pb
        return pb.WorkerStats()


def worker(model_name: str, steps: int, bare: bool, out: str) -> None:
    import torch

    import ringmaster.torch as hvd
    from ringmaster.torch.basics import context

    torch.set_num_threads(1)
    hvd.init()
    if bare:
        figures = _NoFigures()
        context().figures = figures  # type: ignore[assignment]
        if context().link is not None:
            context().link._stats = figures.stats
    torch.manual_seed(0)
    width, layers = MODELS[model_name]
    mods: list[Any] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*mods[:-1])
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer)
    x = torch.randn(64, width)
    times: list[float] = []

    @hvd.elastic.run
    def train(state: Any) -> None:
        for i in range(WARMUP + steps):
            started = time.perf_counter()
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
            state.commit()
            if i >= WARMUP:
                times.append(time.perf_counter() - started)

    train(state)
    if hvd.rank() == 0:
        pathlib.Path(out).write_text(json.dumps({"times": times}))


def _scrape_while(proc: subprocess.Popen, scrapes: list[float]) -> None:
    """Scrape GET /metrics once a second while the job runs (as Prometheus would), timing each."""
    from ringmaster.common.secret import SECRET_ENV

    url = None
    assert proc.stderr is not None
    for line in proc.stderr:
        if '"kind": "api.listening"' in line:
            url = json.loads(line)["url"]
            break
    if url is None:
        return
    request = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {os.environ[SECRET_ENV]}"})
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
    while proc.poll() is None:
        try:
            started = time.perf_counter()
            with urllib.request.urlopen(request, timeout=5) as reply:
                reply.read()
            scrapes.append(time.perf_counter() - started)
        except OSError:
            pass
        time.sleep(1.0)


def run(model_name: str, steps: int, mode: str) -> tuple[float, int, list[float]]:
    """(median seconds per step, timeline bytes, scrape seconds) of one job."""
    from ringmaster.common.secret import SECRET_ENV, generate_secret

    os.environ.setdefault(SECRET_ENV, generate_secret())
    with tempfile.TemporaryDirectory() as tmp:
        out, timeline = os.path.join(tmp, "out.json"), os.path.join(tmp, "timeline.json")
        extra = ["--timeline", timeline] if mode == "metrics+timeline" else []
        proc = subprocess.Popen(
            [sys.executable, "-m", "ringmaster.cli", "run", "-np", "2", "--log-format", "json", *extra, sys.executable,
             __file__, "--worker", model_name, "--steps", str(steps), "--out", out,
             *(["--bare"] if mode == "bare" else [])],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        scrapes: list[float] = []
        scraper = threading.Thread(target=_scrape_while, args=(proc, scrapes), daemon=True)
        if mode != "bare":
            scraper.start()
        else:
            threading.Thread(target=lambda: [None for _ in proc.stderr],
                             daemon=True).start()  # type: ignore[union-attr]
        try:
            code = proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
        assert code == 0, f"the {mode} job failed ({code})"
        times = json.loads(pathlib.Path(out).read_text())["times"]
        size = os.path.getsize(timeline) if extra else 0
        if extra:
            trace = json.loads(pathlib.Path(timeline).read_text())
            assert sum(1 for e in trace if e.get("name") == "optimizer step") >= 2 * steps, "spans missing"
        return statistics.median(times), size, scrapes


def recorder_costs(n: int = 200_000) -> str:
    """What one span and one figure cost the training thread, and a full heartbeat's spans the
    heartbeat thread (in this process, no job)."""
    from ringmaster.common.figures import WorkerFigures
    from ringmaster.common.spans import MAX_SPANS_PER_HEARTBEAT, SpanRecorder, now_us
    from ringmaster.proto import ringmaster_pb2 as pb

    on, off, figures = SpanRecorder(on=True, capacity=n), SpanRecorder(on=False), WorkerFigures()
    started = time.perf_counter()
    for _ in range(n):
        begun = now_us()
        on.add(pb.SPAN_COMMIT, begun, now_us())
    span_us = (time.perf_counter() - started) / n * 1e6
    started = time.perf_counter()
    for _ in range(n):
        with off.span(pb.SPAN_COMMIT):
            pass
    off_us = (time.perf_counter() - started) / n * 1e6
    started = time.perf_counter()
    for _ in range(n):
        figures.commit(0.001)
    figure_us = (time.perf_counter() - started) / n * 1e6
    started = time.perf_counter()
    wire = pb.WorkerHeartbeatRequest(spans=SpanRecorder.proto(on.take(MAX_SPANS_PER_HEARTBEAT))).SerializeToString()
    send_ms = (time.perf_counter() - started) * 1e3
    return (f"a span: {span_us:.2f} us to record (timeline on), {off_us:.2f} us per call site with it off; "
            f"a commit's figures: {figure_us:.2f} us; a heartbeat of {MAX_SPANS_PER_HEARTBEAT} spans: "
            f"{send_ms:.1f} ms to build, {len(wire) / 1024:.0f} KiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=2, help="jobs per way; the best median counts")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.bare, args.out)
        return
    modes = ("bare", "metrics", "metrics+timeline")
    print(f"ringmaster run -np 2, Gloo, 1 thread per rank; commit every step; best of {args.repeats} jobs, "
          f"median of {args.steps} steps after {WARMUP} warm-up")
    print(f"{'model':<10} " + " ".join(f"{m:>22}" for m in modes) + "   timeline per 1000 steps (2 ranks)")
    all_scrapes: list[float] = []
    for name in args.models.split(","):
        best: dict[str, float] = {}
        size = 0
        for _ in range(args.repeats):
            for mode in modes:  # interleaved, so that a slow moment of the machine hits every way alike
                seconds, nbytes, scrapes = run(name, args.steps, mode)
                best[mode] = min(best.get(mode, seconds), seconds)
                size = nbytes or size
                all_scrapes += scrapes
        base = best["bare"]
        cells = [f"{best[m] * 1e3:8.3f} ms {best[m] / base:5.3f}x" for m in modes]
        per_1000 = size / (args.steps + WARMUP) * 1000
        print(f"{name:<10} " + " ".join(f"{c:>22}" for c in cells) + f"   {per_1000 / 1e6:6.2f} MB", flush=True)
    print(recorder_costs())
    if all_scrapes:
        print(f"GET /metrics during the jobs: median {statistics.median(all_scrapes) * 1e3:.2f} ms over "
              f"{len(all_scrapes)} scrapes")


if __name__ == "__main__":
    main()
