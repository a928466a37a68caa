"""The simulated truth of `bench/pool_sim.py`: how fast each of Pollux's six models trains on a
placement, and how much progress it must make, from the measurements in `bench/data/pollux/`
(Pollux's artifact, Apache-2.0: see that folder's SOURCE.md).

Read as Pollux's own simulator reads them (its semantics, this code):
- step and synchronisation time of a placement (GPUs per node) at a per-GPU batch: interpolated
  in the per-batch measurements of that placement where it was measured (up to four nodes), else
  linearly in (nodes, GPUs, per-GPU batch) between all measurements;
- a job at global batch B trains in "progress" (steps at the model's smallest batch, B0, each
  worth (var + sqr) / (var / (B / B0) + sqr) of them, from the gradient's measured square and
  variance at that epoch); it ends when its progress reaches the end of its last epoch.
"""

from __future__ import annotations

import csv
import functools
import math
import pathlib
from dataclasses import dataclass

import numpy as np
from scipy.interpolate import LinearNDInterpolator

DATA = pathlib.Path(__file__).resolve().parent / "data" / "pollux"
#: Epochs each model trains (Pollux's choices) and where its per-GPU batch is capped lower than measured.
EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
MAX_LOCAL_BATCH = {"yolov3": 8}
#: Workers one job may use at most (Pollux's simulator's bound).
MOST_WORKERS = 64


def _rows(path: pathlib.Path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


@dataclass(frozen=True)
class Epochs:
    """What a job at one global batch must do: progress at the end of each epoch, and the gain of
    a step in each epoch."""

    ends: np.ndarray  # progress at the end of epoch e (index e)
    gains: np.ndarray  # progress per step during epoch e


class Model:
    """One of Pollux's models, read from `traces/<name>/`."""

    def __init__(self, name: str) -> None:
        folder = DATA / "traces" / name
        self.name = name
        self.validation: dict[int, dict[str, np.ndarray]] = {}
        for path in sorted(folder.glob("validation-*.csv")):
            rows = _rows(path)
            self.validation[int(path.stem.split("-")[1])] = {
                key: np.array([float(r[key]) for r in rows]) for key in ("progress", "grad_sqr", "grad_var")}
        self.batches = sorted(self.validation)
        self.init_batch = self.batches[0]
        self.max_batch = self.batches[-1]
        placements = _rows(folder / "placements.csv")
        self.by_placement: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        grouped: dict[tuple[int, int, float], list[tuple[float, float]]] = {}
        for row in placements:
            key = row["placement"]
            local, step, sync = float(row["local_bsz"]), float(row["step_time"]), float(row["sync_time"])
            xs, ys = self.by_placement.get(key, (np.empty(0), np.empty((0, 2))))
            self.by_placement[key] = (np.append(xs, local), np.vstack([ys, [step, sync]]))
            grouped.setdefault((len(key), sum(map(int, key)), local), []).append((step, sync))
        self.min_local = min(float(r["local_bsz"]) for r in placements)
        self.max_local = float(MAX_LOCAL_BATCH.get(name, max(float(r["local_bsz"]) for r in placements)))
        points = [list(k) for k in grouped] + []
        values = [list(np.mean(v, axis=0)) for v in grouped.values()]
        for row in _rows(folder / "scalability.csv"):
            points.append([float(row["num_nodes"]), float(row["num_replicas"]), float(row["local_bsz"])])
            values.append([float(row["step_time"]), float(row["sync_time"])])
        self._spread = LinearNDInterpolator(np.array(points), np.array(values))
        self.epochs = EPOCHS[name]

    @functools.lru_cache(maxsize=None)
    def step_and_sync(self, placement: tuple[int, ...], local_batch: int) -> tuple[float, float]:
        """Seconds of one step and of its synchronisation on `placement` (workers per node)."""
        placement = tuple(n for n in placement if n)
        rotated = min(placement[i:] + placement[:i] for i in range(len(placement)))
        key = "".join(map(str, rotated))
        if key in self.by_placement:
            xs, ys = self.by_placement[key]
            order = np.argsort(xs)
            step = float(np.interp(local_batch, xs[order], ys[order, 0]))
            sync = float(np.interp(local_batch, xs[order], ys[order, 1]))
            return step, sync
        nodes = min(len(placement), 16)
        step, sync = self._spread([nodes, sum(placement), local_batch])[0]
        if not math.isfinite(step):
            raise ValueError(f"{self.name}: no measurement near {placement} at batch {local_batch}")
        return float(step), float(sync)

    def _bracket(self, batch: float) -> tuple[int, int, float]:
        lower = max(b for b in self.batches if b <= batch)
        upper = min(b for b in self.batches if b >= batch)
        weight = 0.0 if upper == lower else (batch - lower) / (upper - lower)
        return lower, upper, weight

    @functools.lru_cache(maxsize=None)
    def plan(self, batch: int) -> Epochs:
        """Epoch ends and per-step gains of a job at global batch `batch`."""
        ends = np.array([0.0] + [min(float(v["progress"][e - 1]) for v in self.validation.values())
                                 for e in range(1, self.epochs + 1)])
        lower, upper, w = self._bracket(batch)
        sqr = (1 - w) * self.validation[lower]["grad_sqr"][: self.epochs] + w * self.validation[upper]["grad_sqr"][
            : self.epochs
        ]
        var = (1 - w) * self.validation[lower]["grad_var"][: self.epochs] + w * self.validation[upper]["grad_var"][
            : self.epochs
        ]
        scale = batch / self.init_batch
        gains = (var + sqr) / (var / scale + sqr)
        return Epochs(ends, gains)

    def most_workers(self, batch: int) -> int:
        """The most workers a job at global batch `batch` can use (each at least the smallest
        per-GPU batch measured)."""
        return max(1, min(MOST_WORKERS, int(batch // self.min_local)))

    def configuration(self, batch: int, workers: int) -> tuple[int, int]:
        """(per-pass batch, passes per step) of `workers` sharing `batch` (gradients accumulate over
        several passes where one worker's share exceeds what it can compute at once)."""
        local = math.ceil(batch / workers - 1e-8)
        passes = math.ceil(local / self.max_local - 1e-8)
        if workers == 1 and batch > self.init_batch:
            passes = max(2, passes)
        atomic = math.ceil(local / passes - 1e-8)
        return min(atomic, int(self.max_batch / (workers * passes))), passes


@functools.lru_cache(maxsize=None)
def model(name: str) -> Model:
    return Model(name)


@dataclass(frozen=True)
class TraceJob:
    name: str
    submitted: float
    model: str
    workers: int  # what the job asked for (num_replicas: the rigid baseline's size)
    batch: int


def workload(load: str, number: int) -> list[TraceJob]:
    """Workload `number` (1-8) at relative job load `load` ("0.5", "1.0", "1.5", "2.0")."""
    rows = _rows(DATA / f"workloads-{load}" / f"workload-{number}.csv")
    return [TraceJob(r["name"], float(r["time"]), r["application"], int(r["num_replicas"]), int(r["batch_size"]))
            for r in rows]


def published(policy: str, load: str) -> dict[str, float]:
    """Pollux's published average JCT per workload ("workload-N") for `policy` (pollux, tiresias,
    optimus) at `load`."""
    import json
    with open(DATA / "results" / f"{policy}-{load}.json") as file:
        return {k: float(v) for k, v in json.load(file)["avgs"].items()}
