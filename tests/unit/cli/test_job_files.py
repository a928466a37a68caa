"""The secret `run` made, kept for its owner's commands (real files in a test folder)."""

from __future__ import annotations

import os

import pytest

from ringmaster.cli.job_files import JobFileError, find_job_secret, remove_job_secret, run_folder, save_job_secret

SECRET = "s" * 40


def test_a_saved_secret_is_found_by_the_api_url_on_this_machine_only(tmp_path) -> None:
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    path = save_job_secret("http://127.0.0.1:40123", SECRET, env)
    assert path == tmp_path / "ringmaster" / "api-40123.secret"
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(path.parent).st_mode & 0o777 == 0o700
    assert find_job_secret("http://localhost:40123", env) == SECRET
    assert find_job_secret("http://127.0.0.1:40124", env) is None  # another job
    assert find_job_secret("http://10.20.30.40:40123", env) is None  # the same port elsewhere: never sent there
    with pytest.raises(JobFileError, match="not on this machine"):
        save_job_secret("http://10.20.30.40:40123", SECRET, env)
    again = save_job_secret("http://127.0.0.1:40123", "t" * 40, env)  # left by a job that died: replaced
    assert find_job_secret("http://127.0.0.1:40123", env) == "t" * 40
    remove_job_secret(again)
    assert find_job_secret("http://127.0.0.1:40123", env) is None


def test_a_folder_or_file_others_can_use_is_refused(tmp_path) -> None:
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}
    path = save_job_secret("http://127.0.0.1:40123", SECRET, env)
    os.chmod(path.parent, 0o755)
    with pytest.raises(JobFileError, match="chmod 700"):
        find_job_secret("http://127.0.0.1:40123", env)
    os.chmod(path.parent, 0o700)
    os.chmod(path, 0o644)
    with pytest.raises(Exception, match="chmod 600"):
        find_job_secret("http://127.0.0.1:40123", env)


def test_without_a_runtime_folder_the_home_holds_it() -> None:
    assert str(run_folder({"HOME": "/home/u"})) == "/home/u/.ringmaster/run"
