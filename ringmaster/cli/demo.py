"""`ringmaster demo`: an elastic job that shows what Ringmaster is for, on this machine.

Two emulated hosts (hostA and hostB, two workers each) train a small convolutional network on
scikit-learn's handwritten digits (`examples/digits.py`). While they train, the demo kills hostB
outright (SIGKILL of its agent's process group), lists it again in the discovery script, then
scales the job down and up through the control API, saying each time what to watch. The
training declares a global batch (64 samples per step, in micro-batches of 16), so that at 4, 3
or 2 workers every step is the mean over the same samples. It ends with the test accuracy
beside that of a fault-free run of the same seed, the largest difference between the two runs'
losses at any step, what each fault cost (steps trained again, the pause) and a picture
(`demo.png`, drawn by `ringmaster plot`, the fault-free run's loss under this one's).

The job is a real `ringmaster run` (a child process in its own process group); the demo only
reads its JSON log, writes its discovery file and calls its control API, as a user would.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, TextIO

from ringmaster import __version__, examples
from ringmaster.cli.plot import EXTRA, draw, need_matplotlib
from ringmaster.common.api_client import ApiClient
from ringmaster.common.errors import JobError, UsageError
from ringmaster.common.job_history import JobHistory, describe_difference, read_history

#: The demo's training script (the repository's examples/, installed as ringmaster.examples).
SCRIPT = pathlib.Path(examples.__file__).resolve().parent / "digits.py"
HOSTS = {"hostA": 2, "hostB": 2}
VICTIM = "hostB"
#: The training's global batch, in micro-batches of MICRO_BATCH (examples/digits.py's flags).
GLOBAL_BATCH, MICRO_BATCH = 64, 16
#: Seconds an act may wait for what it caused before the demo gives up on it.
ACT_TIMEOUT_S = 60.0
#: Seconds the demo waits for the job's first steps on 4 workers: 4 interpreters importing torch
#: at once on a loaded 2-core machine took over 60 s (CI).
START_TIMEOUT_S = 180.0
#: Seconds between redraws of the status line on a terminal.
STATUS_EVERY_S = 0.25
_CLEAR = "\r\x1b[K"


@dataclasses.dataclass(frozen=True)
class Pace:
    """How long the demo trains, and at which epochs its acts begin."""

    epochs: int
    kill_at: int  # the epoch during which hostB is killed
    gap: int  # epochs between an act's effect and the next act
    hold_s: float


DEFAULT_PACE = Pace(epochs=42, kill_at=2, gap=3, hold_s=5.0)
# (10 epochs: 96% test accuracy fault-free, 16 gave 97% for 60% more training. The job holds before
# its last epoch until the acts are done, so a slow join on a busy machine needs no epochs to spare)
QUICK_PACE = Pace(epochs=10, kill_at=1, gap=2, hold_s=0.0)


@dataclasses.dataclass
class Progress:
    """What the job's log said so far (written by the reader thread, read by the acts)."""

    lines: list[str] = dataclasses.field(default_factory=list)
    epoch: int = 0
    steps_in_epoch: int = 0
    size: int = 0
    generation: int = 0
    api_url: str = ""
    kinds: list[str] = dataclasses.field(default_factory=list)
    templates: set[str] = dataclasses.field(default_factory=set)  # hosts whose agent's worker template is warm
    holding: bool = False  # the job waits before its last epoch for the acts to end: no epoch passes
    ended: bool = False


class Demo:
    def __init__(self, out_dir: pathlib.Path, pace: Pace, seed: int, console: TextIO) -> None:
        self.out_dir = out_dir
        self.pace = pace
        self.seed = seed
        self.console = console
        self.progress = Progress()
        self.lock = threading.Condition()
        self.hosts_file = out_dir / "hosts.txt"
        # Created after the last act: the job waits for it before its last epoch, so that on a busy
        # machine it cannot end before the acts are done (newcomers that warm up slowly).
        self.acts_done = out_dir / "acts-done"
        self.acts: list[tuple[str, float]] = []  # (what, when: seconds since the epoch)
        self._log: TextIO | None = None  # the job's log, events.jsonl, while the job runs
        self._tty = console.isatty()
        self._status_at = 0.0
        self._status_shown = False
        self.doing = ""  # what the demo waits for now (the status line says it)

    # ------------------------------------------------------------------ the runs
    def training_args(self) -> list[str]:
        # A global batch of 64 in micro-batches of 16: every step is the mean over the same 64
        # samples at 4, 3 or 2 workers, so the run follows the fault-free one step by step.
        return ["python", str(SCRIPT), "--epochs", str(self.pace.epochs), "--seed", str(self.seed),
                "--global-batch-size", str(GLOBAL_BATCH), "--micro-batch-size", str(MICRO_BATCH)]

    def baseline(self) -> JobHistory:
        """The log of the same job without faults (four workers throughout), cached by the
        script's text and arguments and Ringmaster's version."""
        # (keyed by Ringmaster's version too: how a step sums its gradients is the library's)
        key = hashlib.sha256(SCRIPT.read_bytes() + json.dumps([*self.training_args()[2:], __version__]).encode()
                             ).hexdigest()[:16]
        cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "ringmaster"
        cached = cache / f"demo-baseline-{key}.jsonl"
        try:
            with open(cached, encoding="utf-8", errors="replace") as f:
                history = read_history(f)
            if history.final_accuracy() is not None:
                return history
        except OSError:
            pass
        self.say("first, the same training without faults on 4 workers (once: the result is cached) ...")
        log = self.out_dir / "baseline.jsonl"
        with open(log, "w") as f:
            code = subprocess.run([sys.executable, "-m", "ringmaster.cli", "run", "-np", "4", "--spares", "0",
                                   "--log-format", "json", *self.training_args()], stdout=f, stderr=subprocess.STDOUT,
                                  start_new_session=True, timeout=600).returncode
        with open(log) as f:
            history = read_history(f)
        if code != 0 or history.final_accuracy() is None:
            raise JobError(f"the fault-free run failed (exit {code}); its log is {log}")
        cache.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, cached)
        return history

    def run(self) -> int:
        baseline = self.baseline()
        self.say(f"fault-free: test accuracy {100 * (baseline.final_accuracy() or 0.0):.1f}%")
        self.write_hosts(HOSTS)
        script = self.out_dir / "hosts.sh"
        script.write_text(f"#!/bin/sh\ncat '{self.hosts_file}'\n")
        script.chmod(0o755)
        secret_file = self.out_dir / "secret"
        secret_file.unlink(missing_ok=True)
        self.acts_done.unlink(missing_ok=True)
        command = [sys.executable, "-m", "ringmaster.cli", "run", "--host-discovery-script", str(script),
                   "--launcher", "local", "--min-np", "2", "--max-np", "4", "--discovery-interval", "0.5",
                   "--blacklist-cooldown-range", "1", "1", "--log-format", "json",
                   "--timeline", str(self.out_dir / "timeline.json"), "--secret-file", str(secret_file),
                   *self.training_args(), "--hold", str(self.pace.hold_s),
                   "--wait-before-last-epoch", str(self.acts_done)]
        self.say("now the elastic job: hostA and hostB, 2 workers each, --min-np 2 --max-np 4")
        job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
        reader = threading.Thread(target=self._read, args=(job.stdout,), daemon=True)
        reader.start()
        try:
            self._play(secret_file)
            code = job.wait()
        except BaseException:
            _kill_group(job)
            raise
        finally:
            reader.join(timeout=10)
        return self._finish(code, baseline)

    # ------------------------------------------------------------------ the acts
    def _play(self, secret_file: pathlib.Path) -> None:
        self.wait(lambda p: p.api_url != "", "the control API")
        api = self.progress.api_url
        self.say(f"dashboard: {api}/ (open it to watch the job)")
        client = ApiClient(api, secret_file.read_text().strip() if secret_file.exists() else None)
        pace = self.pace

        self.wait(lambda p: p.size == 4 and (p.epoch >= pace.kill_at and p.steps_in_epoch >= 5 or p.holding),
                  "training on 4 workers", START_TIMEOUT_S)
        self.act(f"killing {VICTIM} now (SIGKILL to its agent and workers): watch the survivors roll back to "
                 "their last commit and go on with 2 workers")
        pid = next(h["agent_pid"] for h in client.get("/status")["hosts"] if h["name"] == VICTIM)
        os.killpg(int(pid), signal.SIGKILL)
        self.write_hosts({h: s for h, s in HOSTS.items() if h != VICTIM})  # the machine is gone
        self.wait(lambda p: "job.recovered" in p.kinds, "the job to recover")

        start = self.progress.epoch
        self.wait(lambda p: p.epoch >= start + pace.gap or p.holding, "training on 2 workers")
        self.act(f"{VICTIM} is back: the discovery script lists it again. Its agent starts, its workers warm "
                 "up, and they join at the next commit, with no rollback")
        self.write_hosts(HOSTS)
        before = self.progress.generation
        self.wait(lambda p: p.size == 4 and p.generation > before, f"{VICTIM}'s workers to join")

        start = self.progress.epoch
        self.wait(lambda p: p.epoch >= start + pace.gap or p.holding, "training on 4 workers again")
        # (each agent forks its workers from a template that imported torch: the scale-up below forks them)
        self.wait(lambda p: VICTIM in p.templates, f"{VICTIM}'s agent to warm its worker template")
        self.act("scaling down to 2 workers through the control API (POST /scale): two workers leave at the "
                 "next commit, nothing is rolled back")
        client.post("/scale", {"np": 2})
        self.wait(lambda p: p.size == 2, "the job at 2 workers")

        start = self.progress.epoch
        self.wait(lambda p: p.epoch >= start + pace.gap or p.holding, "training on 2 workers")
        self.act("scaling up to 4 workers: new workers join at the next commit")
        client.post("/scale", {"np": 4})
        self.wait(lambda p: p.size == 4, "the job at 4 workers")
        self.acts_done.touch()
        self.say("nothing more to do: the job trains to its last epoch")
        self.doing = "the job trains to its last epoch"

    def act(self, narration: str) -> None:
        """Say what the demo does now, on the console and in the job's log (a `demo.act` event)."""
        now = time.time()
        self.acts.append((narration, now))
        self.say(narration, mark=">>")
        with self.lock:
            if self._log is not None:
                self._log.write(json.dumps({"logger": "ringmaster.demo", "level": "INFO", "message": narration,
                                            "time": now, "kind": "demo.act", "generation": None}) + "\n")

    def wait(self, condition: Callable[[Progress], bool], what: str, timeout_s: float = ACT_TIMEOUT_S) -> None:
        self.doing = f"waiting for {what}"
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while not condition(self.progress):
                if self.progress.ended:
                    last = "\n  ".join(line.rstrip()[:300] for line in self.progress.lines[-3:])
                    raise JobError(f"the job ended before {what} (its log: {self.out_dir / 'events.jsonl'}); "
                                   f"it said last:\n  {last}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise JobError(f"gave up waiting {timeout_s:g} s for {what} (see {self.out_dir / 'events.jsonl'})")
                self.lock.wait(left)

    def write_hosts(self, hosts: dict[str, int]) -> None:
        fresh = self.hosts_file.with_suffix(".new")
        fresh.write_text("".join(f"{h}:{s}\n" for h, s in hosts.items()))
        fresh.replace(self.hosts_file)  # (the discovery script never reads half a file)

    # ------------------------------------------------------------------ the log
    def _read(self, stream: TextIO) -> None:
        with open(self.out_dir / "events.jsonl", "w") as log:
            with self.lock:
                self._log = log
            for line in stream:
                with self.lock:
                    log.write(line)
                    log.flush()
                self._note(line)
            with self.lock:
                self._log = None
        with self.lock:
            self.progress.ended = True
            self.lock.notify_all()

    def _note(self, line: str) -> None:
        figure = _figure(line)
        event = None if figure is not None else _event(line)
        with self.lock:
            p = self.progress
            p.lines = [*p.lines[-2:], line]
            if figure is not None:
                if figure.get("waiting") is True:
                    p.holding = True
                elif "loss" in figure:
                    epoch = int(figure.get("epoch", 0))
                    p.steps_in_epoch = p.steps_in_epoch + 1 if epoch == p.epoch else 1
                    p.epoch = max(p.epoch, epoch)
                    self._status(figure)
                elif "accuracy" in figure and not figure.get("done"):
                    self.say(f"epoch {figure.get('epoch')}: test accuracy {100 * float(figure['accuracy']):.1f}% "
                             f"on {figure.get('size')} workers")
            elif event is not None:
                kind = event["kind"]
                p.kinds.append(kind)
                if kind == "api.listening":
                    p.api_url = str(event.get("url", ""))
                elif kind == "generation.formed":
                    p.size, p.generation = int(event.get("size", 0)), int(event.get("number", 0))
                elif kind == "template.ready" and isinstance(event.get("host"), str):
                    p.templates.add(event["host"])
                elif kind in ("host.lost", "agent.launching", "template.off") and isinstance(event.get("host"), str):
                    p.templates.discard(event["host"])  # (its agent's template died with it, or it has none yet)
                if kind in _SHOWN:
                    self.say(str(event.get("message", kind)), mark="  ")
            self.lock.notify_all()

    # ------------------------------------------------------------------ the end
    def _finish(self, code: int, baseline: JobHistory) -> int:
        with open(self.out_dir / "events.jsonl") as f:
            history = read_history(f)
        picture = draw(history, self.out_dir / "demo.png", title="ringmaster demo: digits, 2 emulated hosts",
                       against=baseline)
        accuracy = history.final_accuracy()
        self.say("")
        self.say("what happened:" if code == 0 else f"the job failed (exit {code}):")
        for d in history.disruptions():
            cost = []
            if d.recovered_s is not None:
                cost.append(f"recovered in {d.recovered_s:.2f} s")
            if d.pause_s is not None:
                cost.append(f"longest pause {d.pause_s:.2f} s")
            cost.append(f"{d.steps_redone} step(s) trained again")
            self.say(f"  {d.at:6.1f} s  {d.what[:90]}: {', '.join(cost)}")
        if accuracy is not None:
            self.say(f"test accuracy {100 * accuracy:.1f}% (fault-free run of the same seed: "
                     f"{100 * (baseline.final_accuracy() or 0.0):.1f}%)")
        difference = history.largest_loss_difference(baseline)
        if difference is not None:
            self.say(f"loss at every step against the fault-free run: {describe_difference(difference)} (a global "
                     f"batch of {GLOBAL_BATCH} at every size, its sums exact)")
        self.say(f"picture: {picture}")
        self.say(f"timeline: {self.out_dir / 'timeline.json'} (open it in ui.perfetto.dev); "
                 f"log: {self.out_dir / 'events.jsonl'} (`ringmaster plot` draws any such log)")
        return code

    def say(self, text: str, mark: str = "") -> None:
        with self.lock:
            if self._status_shown:
                self.console.write(_CLEAR)
                self._status_shown = False
            print(f"{mark} {text}" if mark else text, file=self.console, flush=True)

    def _status(self, figure: dict) -> None:
        """On a terminal, the live status line: the step, the ring's size, the loss and what the
        demo waits for now (redrawn in place at most every STATUS_EVERY_S)."""
        now = time.monotonic()
        if not self._tty or now - self._status_at < STATUS_EVERY_S:
            return
        self._status_at = now
        line = (f"step {figure.get('step')}, epoch {figure.get('epoch')}, {figure.get('size')} workers, loss "
                f"{figure.get('loss')}" + (f" | {self.doing}" if self.doing else ""))
        self.console.write(_CLEAR + line[:160])
        self.console.flush()
        self._status_shown = True


#: Events the demo repeats on its console (the rest are in events.jsonl).
_SHOWN = ("generation.formed", "host.lost", "host.blacklisted", "job.recovered", "hosts.changed",
          "scale.requested", "job.succeeded", "job.failed")


def _figure(line: str) -> dict | None:
    if not line.startswith("[") or "] {" not in line:
        return None
    try:
        record = json.loads(line.split("] ", 1)[1])
    except ValueError:
        return None
    return record if isinstance(record, dict) and "step" in record else None


def _event(line: str) -> dict | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("kind"), str) else None


def _kill_group(job: subprocess.Popen) -> None:
    try:
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def demo(out: str, quick: bool, hold_s: float | None, seed: int, console: TextIO | None = None) -> int:
    """The `ringmaster demo` verb."""
    need_matplotlib()
    if importlib.util.find_spec("sklearn") is None:  # (the data set)
        raise UsageError(f"the demo trains on scikit-learn's digits: pip install 'ringmaster[{EXTRA}]'")
    pace = QUICK_PACE if quick else DEFAULT_PACE
    if hold_s is not None:
        if not 0 <= hold_s <= 3600:
            raise UsageError(f"--hold {hold_s:g}: give between 0 and 3600 seconds")
        pace = dataclasses.replace(pace, hold_s=hold_s)
    out_dir = pathlib.Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    return Demo(out_dir, pace, seed, console or sys.stdout).run()
