"""`ringmaster plot`: a picture of a job from its log: the loss and the test accuracy against the
step, and the world size against time with each generation shaded by its cause and each fault
marked with what it cost.

matplotlib (the `demo` extra) draws it, headless (the Agg backend: no display needed).
"""

from __future__ import annotations

import pathlib
from typing import Any

from ringmaster.common.errors import UsageError
from ringmaster.common.job_history import FAULT_KINDS, JobHistory, describe_difference, read_history

#: The file a run folder keeps its log in (`ringmaster demo` writes it).
LOG_NAME = "events.jsonl"
#: Pixels of the picture (width, height) at DPI.
SIZE_IN, DPI = (10.0, 9.0), 100
#: A colour per reset cause (`ResetCause` values); the first generation is "start".
CAUSE_COLOURS = {"start": "#dddddd", "failure": "#f4a6a6", "host_lost": "#f4a6a6", "partition": "#f4c6a6",
                 "host_added": "#a6d8f4", "host_removed": "#c6e6c6", "scale": "#e0c6f4", "restart": "#f4e6a6",
                 "other": "#eeeeee"}
EXTRA = "demo"
#: Smallest loss drawn (the log scale's floor).
LOSS_FLOOR = 1e-5


def need_matplotlib() -> Any:
    """pyplot on the headless backend; `UsageError` naming the extra when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(f"plotting needs matplotlib: pip install 'ringmaster[{EXTRA}]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot
    return pyplot


def log_path(source: str) -> pathlib.Path:
    """The log a `ringmaster plot` argument names: a file, or a run folder holding events.jsonl."""
    path = pathlib.Path(source)
    if path.is_dir():
        path = path / LOG_NAME
    if not path.is_file():
        raise UsageError(f"{source}: no such log (give a job's JSON log, as `ringmaster run --log-format json` or "
                         f"`ringmaster events --json` print it, or a folder holding {LOG_NAME})")
    return path


def load(source: str) -> JobHistory:
    path = log_path(source)
    with open(path, encoding="utf-8", errors="replace") as f:
        history = read_history(f)
    if not history.events:
        raise UsageError(f"{path}: holds no Ringmaster events (was the job run with --log-format json?)")
    return history


def main_cause(causes: tuple[str, ...]) -> str:
    """The cause a generation is shaded by: a host's loss before its workers' failures, which a
    host's death also causes (the dashboard's order)."""
    for cause in ("host_lost", "partition", "failure", "scale", "host_added", "host_removed", "restart"):
        if cause in causes:
            return cause
    return causes[0] if causes else "start"


def draw(history: JobHistory, out: pathlib.Path, title: str = "", against: JobHistory | None = None) -> pathlib.Path:
    """Write the picture of `history` to `out` (PNG), with `against`'s loss drawn under its
    own (a fault-free run of the same seed); returns `out`."""
    pyplot = need_matplotlib()
    fig = figure(history, title, against)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    pyplot.close(fig)
    return out


def figure(history: JobHistory, title: str = "", against: JobHistory | None = None) -> Any:
    """The picture's three panels: loss (with `against`'s under it), test accuracy (against the
    step), world size (against time)."""
    pyplot = need_matplotlib()
    fig, (loss_ax, acc_ax, size_ax) = pyplot.subplots(3, 1, figsize=SIZE_IN, dpi=DPI)
    steps = [p for p in history.points if p.loss is not None]
    accuracies = [p for p in history.points if p.accuracy is not None]
    if against is not None:
        reference = sorted(against.loss_by_step().items())
        loss_ax.plot([s for s, _ in reference], [max(v, LOSS_FLOOR) for _, v in reference], "-", linewidth=3,
                     color="#ff7f0e", alpha=0.6, label="fault-free run")
    # (on a log scale, floored: a loss printed as 0.0 is below the printed precision, not zero)
    loss_ax.plot([p.step for p in steps], [max(p.loss or 0.0, LOSS_FLOOR) for p in steps], ".", markersize=2,
                 color="#1f77b4", label="this run")
    if against is not None:
        loss_ax.legend(fontsize=8, loc="upper right", title_fontsize=8,
                       title="against the fault-free run: "
                             f"{describe_difference(history.largest_loss_difference(against))}")
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("training loss (rank 0)")
    if steps and all((p.loss or 0.0) >= 0 for p in steps):
        loss_ax.set_yscale("log")
    loss_ax.set_title(title or "Training", loc="left")
    if not steps:
        loss_ax.text(0.5, 0.5, "no loss figures in this log", ha="center", transform=loss_ax.transAxes)
    acc_ax.plot([p.step for p in accuracies], [100 * (p.accuracy or 0) for p in accuracies], "o-", color="#2ca02c")
    acc_ax.set_xlabel("step")
    acc_ax.set_ylabel("test accuracy (%)")
    if not accuracies:
        acc_ax.text(0.5, 0.5, "no accuracy figures in this log", ha="center", transform=acc_ax.transAxes)

    generations = history.generations
    end = history.end
    for i, gen in enumerate(generations):
        until = generations[i + 1].started if i + 1 < len(generations) else end
        cause = main_cause(gen.causes)
        size_ax.axvspan(gen.started, until, color=CAUSE_COLOURS.get(cause, "#eeeeee"), alpha=0.8, linewidth=0)
    times = [g.started for g in generations] + ([end] if generations else [])
    sizes = [g.size for g in generations] + ([generations[-1].size] if generations else [])
    size_ax.step(times, sizes, where="post", color="black", linewidth=2)
    top = max(sizes, default=1) + 3
    for i, d in enumerate(history.disruptions()):
        colour = "#d62728" if d.kind in FAULT_KINDS else "#555555"
        size_ax.axvline(d.at, color=colour, linestyle="--", linewidth=1)
        label = _label(d.kind, d.what)
        if d.recovered_s is not None:
            label += f"\nrecovered in {d.recovered_s:.2f} s"
        elif d.pause_s is not None:
            label += f"\npause {d.pause_s:.2f} s"
        # (staggered: changes seconds apart would write over each other)
        size_ax.text(d.at, top - 0.1 - 0.9 * (i % 3), " " + label.replace("\n", "\n "), fontsize=7, va="top",
                     color=colour, bbox={"facecolor": "white", "alpha": 0.7, "linewidth": 0, "pad": 1})
    size_ax.set_ylim(0, top + 0.2)
    size_ax.set_xlim(0, max(end, 1.0))
    size_ax.set_xlabel("seconds since the job started")
    size_ax.set_ylabel("world size")
    from matplotlib.patches import Patch
    shown = dict.fromkeys(main_cause(g.causes) for g in generations)
    size_ax.legend(handles=[Patch(color=CAUSE_COLOURS.get(c, "#eeeeee"), label=f"ring formed: {c.replace('_', ' ')}")
                            for c in shown], fontsize=7, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=4,
                   frameon=False)
    fig.tight_layout()
    return fig


def _label(kind: str, message: str) -> str:
    if kind == "host.lost":
        return message.split(":")[0]  # "host hostB lost"
    if kind == "worker.failed":
        return "worker failed"
    if kind == "scale.requested":
        return message.replace(" workers requested", "")
    if kind == "hosts.changed":
        return message.replace("discovery: ", "")[:40]
    return message[:40]


def plot(source: str, out: str, against: str | None = None) -> int:
    """The `ringmaster plot` verb."""
    history = load(source)
    reference = load(against) if against is not None else None
    path = draw(history, pathlib.Path(out), title=f"{source}", against=reference)
    print(f"wrote {path} ({len(history.generations)} generation(s), {len(history.points)} figure(s))")
    if reference is not None:
        print(f"loss against {against}: {describe_difference(history.largest_loss_difference(reference))}")
    return 0
