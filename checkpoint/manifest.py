"""What a durable checkpoint says about itself, in `manifest.json` beside its files.

The manifest is written last, so a checkpoint folder without one was never finished. It holds
the step (commit count), the world size and generation that wrote it, and the size and SHA-256
of every file, so a torn, truncated or corrupted checkpoint is recognised and skipped.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ringmaster.common.errors import JobFatalError, RingmasterError

#: Identifies Ringmaster checkpoints; anything else in the folder is left alone.
FORMAT = "ringmaster-checkpoint"
#: Bumped when the layout changes; a newer version is refused with a message, never misread.
VERSION = 1
MANIFEST_NAME = "manifest.json"
#: The state itself, a `torch.save` file: `torch.load(path, weights_only=True)["model"]`.
STATE_NAME = "state.pt"


class FileEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: str = FORMAT
    version: int = VERSION
    step: int = Field(ge=0, description="commits of the state when it was committed")
    world_size: int = Field(ge=1)
    generation: int = Field(ge=0)
    created: float = Field(description="seconds since the epoch, when the commit was handed to the writer")
    files: dict[str, FileEntry]


class CheckpointError(RingmasterError):
    """A checkpoint that cannot be used, and why."""


class CheckpointFolderError(JobFatalError):
    """The checkpoint folder cannot be made or written (a path under a plain file, a read-only
    or foreign folder): the job was asked for checkpoints and would train without any."""


class UntrustedCheckpointError(JobFatalError):
    """The newest checkpoint holds objects that only a full unpickle could rebuild, and the job
    did not say the folder is trusted. The worker stops: starting over would prune the folder."""
