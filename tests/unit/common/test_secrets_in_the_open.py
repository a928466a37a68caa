"""Secrets never where others can read them: not in a command line, not on plain HTTP to another
machine, not in key files other users can read (pure logic and real files)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from harness import ROOT
from tls_files import make_tls_files

from ringmaster.common.api_client import ApiClient, ApiError
from ringmaster.common.tls import ServerTls, TlsError
from ringmaster.rendezvous.state.etcd_kv import tls_credentials
from ringmaster.rendezvous.state.kv import StoreAccessRefused
from ringmaster.rendezvous.state.url import EtcdAccess


def test_a_store_password_in_the_url_is_refused_at_start_and_not_repeated(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "ringmaster.cli", "serve", "-H", "a:1", "--store",
                           "etcd://root:hunter2@127.0.0.1:1", "python", "t.py"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "a password in the URL can be read by every user" in proc.stderr and "--store-password-file" in proc.stderr
    assert "hunter2" not in proc.stderr + proc.stdout


def test_the_store_password_comes_from_a_private_file_or_the_environment(tmp_path) -> None:
    from ringmaster.cli.main import build_parser, store_password

    password = tmp_path / "password"
    password.write_text("hunter2\n")
    password.chmod(0o600)
    args = build_parser().parse_args(["serve", "-H", "a:1", "--store-password-file", str(password), "python", "t.py"])
    assert store_password(args) == "hunter2"
    password.chmod(0o644)
    with pytest.raises(Exception, match="can be read by other users"):
        store_password(args)
    args = build_parser().parse_args(["serve", "-H", "a:1", "python", "t.py"])
    os.environ["RINGMASTER_STORE_PASSWORD"] = "from-env"
    try:
        assert store_password(args) == "from-env"
    finally:
        del os.environ["RINGMASTER_STORE_PASSWORD"]


@pytest.mark.parametrize("url, secret, refused", [
    ("http://10.1.2.3:8080", "s" * 32, True),  # the secret would cross the network in the clear
    ("http://example.org:8080", "s" * 32, True),
    ("https://10.1.2.3:8080", "s" * 32, False),
    ("http://127.0.0.1:8080", "s" * 32, False),  # never leaves this machine
    ("http://localhost:8080", "s" * 32, False),
    ("http://10.1.2.3:8080", None, False),  # nothing secret to send
])
def test_clients_never_send_the_secret_over_plain_http_to_another_machine(url, secret, refused) -> None:
    if refused:
        with pytest.raises(ApiError, match="would send the job secret in the clear"):
            ApiClient(url, secret)
    else:
        ApiClient(url, secret)


def test_key_files_that_other_users_can_read_are_refused(tmp_path) -> None:
    files = make_tls_files(tmp_path / "tls")
    assert ServerTls.from_files(str(files.cert), str(files.key)) is not None
    tls_credentials(EtcdAccess(tls=True, ca_file=str(files.ca), cert_file=str(files.cert), key_file=str(files.key)))
    files.key.chmod(0o644)
    with pytest.raises(TlsError, match="--tls-key .* can be read by other users \\(mode 644\\); chmod 600 it"):
        ServerTls.from_files(str(files.cert), str(files.key))
    with pytest.raises(StoreAccessRefused, match="--store-key .* can be read by other users"):
        tls_credentials(EtcdAccess(tls=True, ca_file=str(files.ca), cert_file=str(files.cert), key_file=str(files.key)))
