"""Where a job started by `ringmaster run` keeps the secret it made, so that its owner's
`ringmaster scale`, `status` and `events` can use it without being told.

`run` makes a secret when none is given; without this file it would live only in that process,
and every change through the control API would be refused. The file is the secret alone, mode
600, in a folder of the user's own (mode 700): `$XDG_RUNTIME_DIR/ringmaster` where the system
gives one (a per-user folder in memory), else `~/.ringmaster/run`. It is named by the control
API's port (`api-PORT.secret`), and looked up only for an API on this machine: a secret is never
sent to a server elsewhere because a local job happens to use the same port. The file goes when
the job ends. A folder or file that other users could read or write is refused, never used.
"""

from __future__ import annotations

import os
import pathlib
import stat
import urllib.parse

from ringmaster.common.errors import UsageError
from ringmaster.common.network import is_this_machine, this_machine_names
from ringmaster.common.secret import check_secret, read_private_file


class JobFileError(UsageError):
    """The per-user run folder or a job's file cannot be used safely; the message says why."""


def run_folder(environ: dict[str, str] | os._Environ[str] = os.environ) -> pathlib.Path:
    """The folder of this user's jobs' files (not created here)."""
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return pathlib.Path(runtime) / "ringmaster"
    return pathlib.Path(environ.get("HOME") or pathlib.Path.home()) / ".ringmaster" / "run"


def _private_folder(folder: pathlib.Path) -> pathlib.Path:
    """`folder`, made (mode 700) if missing; refused when it is a link, not ours, or open to others."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise JobFileError(f"{folder} is not a folder (a link or a file); remove it")
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise JobFileError(f"{folder} belongs to another user or others may use it (mode "
                           f"{stat.S_IMODE(info.st_mode):o}); chmod 700 it or remove it")
    return folder


def _name(api_url: str) -> str | None:
    """The file name for a control API on this machine, or None for one elsewhere."""
    parsed = urllib.parse.urlparse(api_url)
    if parsed.port is None or not is_this_machine(parsed.hostname or "", this_machine_names()):
        return None
    return f"api-{parsed.port}.secret"


def save_job_secret(api_url: str, secret: str, environ: dict[str, str] | os._Environ[str] = os.environ) -> pathlib.Path:
    """Write the secret of the job whose control API is at `api_url`; the file's path."""
    name = _name(api_url)
    if name is None:
        raise JobFileError(f"the control API {api_url} is not on this machine")
    path = _private_folder(run_folder(environ)) / name
    try:
        path.unlink()  # one left by a job that died without removing it (the port is ours now)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return path


def find_job_secret(api_url: str, environ: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """The secret `run` saved for the job whose control API is at `api_url` on this machine, or None."""
    name = _name(api_url)
    if name is None:
        return None
    path = run_folder(environ) / name
    if not path.exists():
        return None
    _private_folder(path.parent)
    return check_secret(read_private_file(path, "the job's secret file"), str(path))


def remove_job_secret(path: pathlib.Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
