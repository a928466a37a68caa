"""Durable checkpoints of one training state, as the worker sees them.

Configured by the job (`--checkpoint-dir`, `--checkpoint-every`, `--checkpoint-interval`,
`--checkpoint-keep`, passed in the environment) or by setting the same variables for a script
run alone. Only rank 0 writes (every rank holds the same commit); only a rank 0 that has never
committed reads, which happens exactly when the whole job starts afresh: the first start, or a
restart after every worker died.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping

from ringmaster.checkpoint.directory import CheckpointDirectory
from ringmaster.checkpoint.manifest import Manifest
from ringmaster.checkpoint.memory import HostSnapshot
from ringmaster.checkpoint.policy import CheckpointPolicy
from ringmaster.checkpoint.writer import BackgroundWriter
from ringmaster.proto import environment as env_names
from ringmaster.settings import DEFAULT_CHECKPOINT_KEEP

#: Seconds a finishing worker waits for its last checkpoint to reach the disk.
FINAL_WRITE_TIMEOUT_S = 600.0


class Checkpointing:
    def __init__(self, directory: CheckpointDirectory, policy: CheckpointPolicy, report: Callable[[str], None],
                 report_load: Callable[[str], None] | None = None, trusted: bool = False,
                 report_written: Callable[[str], None] | None = None) -> None:
        """`report` hears of writes that failed; `report_load` (default: `report`) of checkpoints
        skipped when resuming; `report_written` (default: `report`) of the first write that
        succeeded. `trusted`: load full pickles (see `CheckpointDirectory.load_newest`)."""
        self.directory = directory
        self.trusted = trusted
        self.policy = policy
        self.report = report
        self.report_load = report_load or report
        self.writer = BackgroundWriter(directory, report, report_written)

    @classmethod
    def from_environ(cls, report: Callable[[str], None], environ: Mapping[str, str] | None = None,
                     report_load: Callable[[str], None] | None = None,
                     report_written: Callable[[str], None] | None = None) -> "Checkpointing | None":
        env = os.environ if environ is None else environ
        folder = env.get(env_names.CHECKPOINT_DIR)
        if not folder:
            return None
        try:
            every = int(env[env_names.CHECKPOINT_EVERY]) if env.get(env_names.CHECKPOINT_EVERY) else None
            interval = float(env[env_names.CHECKPOINT_INTERVAL]) if env.get(env_names.CHECKPOINT_INTERVAL) else None
            keep = int(env.get(env_names.CHECKPOINT_KEEP) or DEFAULT_CHECKPOINT_KEEP)
            trusted = env.get(env_names.CHECKPOINT_TRUSTED, "") == "1"
            return cls(CheckpointDirectory(folder, keep), CheckpointPolicy(every, interval), report, report_load,
                       trusted,
                       report_written)
        except ValueError as exc:
            raise ValueError(
                f"bad checkpoint settings in the environment ({env_names.CHECKPOINT_DIR}=...): {exc}"
            ) from None

    def after_commit(self, snapshot: HostSnapshot, step: int, rank: int, size: int, generation: int) -> None:
        """Hand the commit to the writer if a checkpoint is due (rank 0 only; never waits)."""
        if rank != 0:
            return
        now = time.monotonic()
        if self.policy.due(step, now) and self.writer.submit(snapshot, step, size, generation):
            self.policy.written(step, now)

    def load_newest(self) -> tuple[Manifest, Any] | None:
        """The newest usable checkpoint (rank 0 of a job that starts afresh), after checking that
        the folder can be written: a job asked for checkpoints fails at once rather than train
        without any (`CheckpointFolderError`)."""
        self.directory.check_writable()
        found = self.directory.load_newest(self.report_load, self.trusted)
        if found is None and self.directory.checkpoints():
            self.report_load(f"no usable checkpoint in {self.directory.path}: starting from the initial state")
        return found

    def resumed(self, step: int) -> None:
        self.policy.start(step, time.monotonic())

    def finish(self, snapshot: HostSnapshot, step: int, rank: int, size: int, generation: int) -> str:
        """At the end of training: make the last commit durable and wait for the disk. Returns
        a warning for the job's end summary when the final checkpoint did not reach the disk."""
        if rank != 0:
            return ""
        self.writer.flush(FINAL_WRITE_TIMEOUT_S)
        newer = step > 0 and (not self.writer.written or self.writer.written[-1] < step)
        if newer and self.writer.submit(snapshot, step, size, generation):
            self.writer.flush(FINAL_WRITE_TIMEOUT_S)
        if step > 0 and (not self.writer.written or self.writer.written[-1] < step):
            newest = f"step {self.writer.written[-1]}" if self.writer.written else "none from this run"
            warning = (f"the final checkpoint (step {step}) was not written to {self.directory.path}"
                       f"{': ' + self.writer.last_failure if self.writer.last_failure else ''}; "
                       f"the newest checkpoint written is {newest}")
            self.report(warning)
            return warning
        return ""
