"""A folder of durable checkpoints: atomic writes, verification, the newest good one, retention.

Layout: `DIR/step-000000001234/{state.pt, manifest.json}`. A checkpoint is written into a
hidden temporary folder, every file and the folder are fsynced, and only then is it renamed
into place and the parent folder fsynced: a crash at any moment leaves either the complete
checkpoint or no trace of it under its final name. `state.pt` is a plain `torch.save` file.
Checkpoints hold the model: their folders are made 0700 and their files 0600 (the job's user's
alone, whatever the umask). One that fails verification when a job resumes is moved aside
(`.refused-step-...`), so it no longer counts among the `keep` newest.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import pickle
import re
import shutil
import socket
import time
from typing import Any, BinaryIO, Callable

import torch
from pydantic import ValidationError

from ringmaster.checkpoint.manifest import (
    FORMAT,
    MANIFEST_NAME,
    STATE_NAME,
    VERSION,
    CheckpointError,
    CheckpointFolderError,
    FileEntry,
    Manifest,
    UntrustedCheckpointError,
)
from ringmaster.settings import DEFAULT_CHECKPOINT_KEEP

_PREFIX = "step-"
_TMP_PREFIX = ".tmp-"
#: A checkpoint moved aside after it failed verification (kept for a look; never loaded or counted).
REFUSED_PREFIX = ".refused-"
#: Checkpoint folders and files: the job's user's alone (they hold the model).
FOLDER_MODE, FILE_MODE = 0o700, 0o600
_CHUNK = 8 << 20


class CheckpointDirectory:
    def __init__(self, path: str | os.PathLike[str], keep: int = DEFAULT_CHECKPOINT_KEEP) -> None:
        if keep < 1:
            raise ValueError(f"--checkpoint-keep must be at least 1, not {keep}")
        self.path = pathlib.Path(path)
        self.keep = keep

    # ------------------------------------------------------------ writing
    def write(self, tree: Any, step: int, world_size: int, generation: int, created: float) -> pathlib.Path:
        """Write `tree` as the checkpoint of `step`; returns its folder. Raises OSError (disk
        full, read-only, ...) with nothing left behind but the checkpoints already there."""
        self.path.mkdir(parents=True, exist_ok=True, mode=FOLDER_MODE)
        name = f"{_PREFIX}{step:012d}"
        final = self.path / name
        tmp = self.path / f"{_TMP_PREFIX}{name}-{os.getpid()}"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(mode=FOLDER_MODE)
            os.chmod(tmp, FOLDER_MODE)  # (the umask may take more than mkdir's mode leaves)
            with open(_private(tmp / STATE_NAME), "wb", buffering=0) as raw:
                hashing = _HashingFile(raw)
                try:
                    torch.save(tree, hashing)  # type: ignore[arg-type]  # file-like: write() and flush()
                except Exception:
                    if hashing.error is not None:  # torch re-wraps it; the OSError says what happened
                        raise hashing.error from None
                    raise
                os.fsync(raw.fileno())
            manifest = Manifest(
                step=step, world_size=world_size, generation=generation, created=created,
                files={STATE_NAME: FileEntry(bytes=hashing.size, sha256=hashing.hexdigest())},
            )
            with open(_private(tmp / MANIFEST_NAME), "w") as f:
                f.write(manifest.model_dump_json(indent=2))
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(tmp)
            if final.exists():  # the same step written before (or a corrupt leftover of it)
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(self.path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.prune()
        return final

    def check_writable(self) -> None:
        """Make the folder if need be and write a file into it; `CheckpointFolderError` naming the
        folder and why when that cannot be done (a job asked for checkpoints must not train on
        without any: it fails at once instead)."""
        probe = self.path / f"{_TMP_PREFIX}probe-{os.getpid()}"
        try:
            self.path.mkdir(parents=True, exist_ok=True, mode=FOLDER_MODE)
            with open(_private(probe), "wb") as f:
                f.write(b"ringmaster")
            probe.unlink()
        except OSError as exc:
            raise CheckpointFolderError(
                f"the checkpoint folder {self.path} cannot be written on host {socket.gethostname()} "
                f"({exc.strerror or exc}): give --checkpoint-dir a folder the job's workers can create and write"
            ) from None

    def move_aside(self, folder: pathlib.Path) -> pathlib.Path | None:
        """Rename a checkpoint that failed verification out of the way (`REFUSED_PREFIX`): it is
        kept for a look but no longer counts among the `keep` newest. None if it cannot be moved."""
        aside = folder.with_name(f"{REFUSED_PREFIX}{folder.name}-{int(time.time())}")
        try:
            os.rename(folder, aside)
        except OSError:
            return None
        return aside

    def prune(self) -> None:
        """Keep the `keep` newest checkpoints; remove older ones."""
        for old in self.checkpoints()[self.keep:]:
            shutil.rmtree(old, ignore_errors=True)

    def remove_unfinished(self) -> None:
        """Remove temporary folders left by a writer that died (call before writing starts)."""
        if self.path.is_dir():
            for entry in self.path.iterdir():
                if entry.name.startswith(_TMP_PREFIX):
                    shutil.rmtree(entry, ignore_errors=True)

    # ------------------------------------------------------------ reading
    def checkpoints(self) -> list[pathlib.Path]:
        """Checkpoint folders, newest step first."""
        if not self.path.is_dir():
            return []
        found = []
        for entry in self.path.iterdir():
            if entry.name.startswith(_PREFIX) and entry.name[len(_PREFIX):].isdigit() and entry.is_dir():
                found.append((int(entry.name[len(_PREFIX):]), entry))
        return [entry for _, entry in sorted(found, reverse=True)]

    def verify(self, folder: pathlib.Path) -> Manifest:
        """The manifest of `folder` after checking every file's size and SHA-256."""
        manifest = read_manifest(folder)
        for name, entry in manifest.files.items():
            path = folder / name
            if not path.is_file():
                raise CheckpointError(f"{name} is missing")
            size = path.stat().st_size
            if size != entry.bytes:
                raise CheckpointError(f"{name} has {size} bytes, the manifest says {entry.bytes} (truncated?)")
            if _sha256(path) != entry.sha256:
                raise CheckpointError(f"{name} does not match its SHA-256 in the manifest (corrupted)")
        return manifest

    def load_newest(self, report: Callable[[str], None], trusted: bool = False) -> tuple[Manifest, Any] | None:
        """The newest checkpoint that verifies, loaded; every one skipped on the way is reported
        with its reason. None when there is none.

        A checkpoint is data: it is loaded with `weights_only=True` (tensors, containers, numbers,
        strings), which runs no code whatever the file holds; the checksums catch accidents, not
        forgeries. A file that needs more (objects of the script's own classes, numpy arrays) is
        refused with `UntrustedCheckpointError`, never skipped for an older one: those were
        written by the same script and a fresh start would prune them. `trusted=True` (the
        `--checkpoint-trusted` flag) loads full pickles, for folders only the job can write.
        """
        for folder in self.checkpoints():
            try:
                manifest = self.verify(folder)
                tree = _load_state(folder / STATE_NAME, trusted)
            except CheckpointError as exc:
                report(f"checkpoint {folder} skipped: {exc}{self._aside(folder)}; trying the one before")
                continue
            except UntrustedCheckpointError:
                raise
            except Exception as exc:  # a file that verifies but does not load: still skip it
                report(f"checkpoint {folder} skipped: it does not load ({type(exc).__name__}: {exc})"
                       f"{self._aside(folder)}; trying the one before")
                continue
            return manifest, tree
        return None

    def _aside(self, folder: pathlib.Path) -> str:
        aside = self.move_aside(folder)
        return f" (moved aside to {aside.name})" if aside is not None else ""


def _load_state(path: pathlib.Path, trusted: bool) -> Any:
    if trusted:
        return torch.load(path, map_location="cpu", weights_only=False)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        named = _UNSUPPORTED.search(str(exc))
        what = f"an object of {named.group(1)}" if named else "objects other than tensors and plain containers"
        raise UntrustedCheckpointError(
            f"{path} holds {what}; loading it would run code from the file, so it is refused. "
            "Keep only tensors, numbers, strings, lists and dicts in the state, or, if only this job can "
            "write that folder, pass --checkpoint-trusted (RINGMASTER_CHECKPOINT_TRUSTED=1) to load it in full"
        ) from None


#: How torch names the global a weights-only load refused.
_UNSUPPORTED = re.compile(r"unsupported (?:global: )?GLOBAL ([\w.]+)", re.IGNORECASE)


def read_manifest(folder: pathlib.Path) -> Manifest:
    path = folder / MANIFEST_NAME
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"it has no {MANIFEST_NAME} (never finished)") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{MANIFEST_NAME} is unreadable ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CheckpointError(f"{MANIFEST_NAME} is not a {FORMAT} manifest")
    version = raw.get("version")
    if version != VERSION:
        raise CheckpointError(
            f"it was written in checkpoint format version {version!r} and this Ringmaster reads version {VERSION}; "
            "use the Ringmaster that wrote it or move the folder away"
        )
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        raise CheckpointError(f"{MANIFEST_NAME} is invalid: {exc.errors()[0]['msg']}") from None


class _HashingFile:
    """A write-only file that hashes what goes through it (one pass for writing and checksum).
    Short writes are retried, so a full disk surfaces as its OSError (kept in `error`)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._hash = hashlib.sha256()
        self.size = 0
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        view = memoryview(data).cast("B")
        self._hash.update(view)
        done = 0
        try:
            while done < view.nbytes:
                done += self._raw.write(view[done:]) or 0
        except OSError as exc:
            self.error = exc
            raise
        self.size += done
        return done

    def flush(self) -> None:
        self._raw.flush()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _private(path: pathlib.Path) -> pathlib.Path:
    """Create `path` empty with `FILE_MODE` (whatever the umask) and return it, for `open` to write."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    os.close(fd)
    return path


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
