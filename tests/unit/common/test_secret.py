"""The job secret's files (real files); its keys and the calls they sign are in test_seal."""

from __future__ import annotations

import os

import pytest

from ringmaster.common.secret import MIN_SECRET_CHARS, SecretError, read_secret_file, secret_from


def test_secret_files_are_made_private_and_read_back(tmp_path) -> None:
    path = tmp_path / "secret"
    made = read_secret_file(path, create=True)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert read_secret_file(path) == made == secret_from(str(path), {})
    os.chmod(path, 0o644)
    with pytest.raises(SecretError, match="can be read by other users.*chmod 600"):
        read_secret_file(path)
    with pytest.raises(SecretError, match="cannot read --secret-file"):
        read_secret_file(tmp_path / "missing")
    with pytest.raises(SecretError, match=f"needs at least {MIN_SECRET_CHARS}"):
        secret_from(None, {"RINGMASTER_SECRET": "short"})
    assert secret_from(None, {}) is None
