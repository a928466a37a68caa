"""The job secret's tokens and files (pure logic, real files)."""

from __future__ import annotations

import os

import pytest

from ringmaster.common.secret import (
    MIN_SECRET_CHARS, SecretError, TokenChecker, generate_secret, make_proof, make_token, proof_is_good,
    read_secret_file, secret_from,
)

METHOD = "/ringmaster.v1.Rendezvous/Ready"
NOW = 1_800_000_000.0


def test_a_token_works_once_for_its_method_within_its_window() -> None:
    secret = generate_secret()
    checker = TokenChecker(secret, window_s=300)
    token, nonce = make_token(secret, METHOD, NOW)
    assert checker.check(METHOD, token, NOW + 1) == (nonce, "")
    assert "used before" in checker.check(METHOD, token, NOW + 2)[1]
    other, _ = make_token(secret, METHOD, NOW)
    assert "not signed" in checker.check("/ringmaster.v1.Rendezvous/ReportDone", other, NOW)[1]
    stale, _ = make_token(secret, METHOD, NOW - 301)
    assert "from this host's clock" in checker.check(METHOD, stale, NOW)[1]
    foreign, _ = make_token(generate_secret(), METHOD, NOW)
    assert "not signed" in checker.check(METHOD, foreign, NOW)[1]


@pytest.mark.parametrize("token", [None, "", "v1", "v2.1.2.abc.def", "v1.x.y.abc.def", "v1." + "9" * 300, "a.b.c.d.e.f"])
def test_malformed_tokens_are_refused_with_a_reason(token) -> None:
    nonce, why = TokenChecker(generate_secret()).check(METHOD, token, NOW)
    assert nonce is None and why


def test_remembered_nonces_are_bounded_and_forgotten_when_their_tokens_expire() -> None:
    secret = generate_secret()
    checker = TokenChecker(secret, window_s=10, max_nonces=100)
    for i in range(1000):
        token, _ = make_token(secret, METHOD, NOW + i * 0.001)
        assert checker.check(METHOD, token, NOW + i * 0.001)[0]
    assert len(checker._seen) <= 100
    token, _ = make_token(secret, METHOD, NOW + 100)
    checker.check(METHOD, token, NOW + 100)
    assert len(checker._seen) == 1  # everything older than the window went


def test_the_answer_proves_the_secret_for_this_call_only() -> None:
    secret = generate_secret()
    _, nonce = make_token(secret, METHOD, NOW)
    assert proof_is_good(secret, nonce, make_proof(secret, nonce))
    assert not proof_is_good(secret, nonce, make_proof(generate_secret(), nonce))
    assert not proof_is_good(secret, nonce, make_proof(secret, "another-nonce"))
    assert not proof_is_good(secret, nonce, None)


def test_secret_files_are_made_private_and_read_back(tmp_path) -> None:
    path = tmp_path / "secret"
    made = read_secret_file(path, create=True)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert read_secret_file(path) == made == secret_from(str(path), {})
    os.chmod(path, 0o644)
    with pytest.raises(SecretError, match="can be read by other users.*chmod 600"):
        read_secret_file(path)
    with pytest.raises(SecretError, match="cannot read the job secret from --secret-file"):
        read_secret_file(tmp_path / "missing")
    with pytest.raises(SecretError, match=f"needs at least {MIN_SECRET_CHARS}"):
        secret_from(None, {"RINGMASTER_SECRET": "short"})
    assert secret_from(None, {}) is None
