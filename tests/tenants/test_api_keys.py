"""API key format, hashing, admin key check and the Bearer header."""

from __future__ import annotations

import hashlib

import pytest

from tenants import AuthFailed, bearer_token, hash_key, new_admin_key, verify_admin
from tenants.api_keys import key_id_of, key_matches, new_key


def test_new_keys_are_unique_and_name_their_id() -> None:
    issued = [new_key() for _ in range(50)]
    assert len({plaintext for _, plaintext in issued}) == 50
    for key_id, plaintext in issued:
        assert key_id_of(plaintext) == key_id
        assert key_matches(plaintext, hash_key(plaintext))
        assert not key_matches(plaintext[:-1] + "?", hash_key(plaintext))


def test_hash_is_sha256_of_the_whole_key() -> None:
    _, plaintext = new_key()
    assert hash_key(plaintext) == hashlib.sha256(plaintext.encode()).hexdigest()


@pytest.mark.parametrize(
    "bad", ["", "fg_", "fg_0123456789abcdef_short", "xx_0123456789abcdef_" + "a" * 43]
)
def test_malformed_keys_fail(bad: str) -> None:
    with pytest.raises(AuthFailed):
        key_id_of(bad)


def test_admin_key() -> None:
    admin = new_admin_key()
    digest = hash_key(admin)
    assert verify_admin(admin, digest)
    assert not verify_admin(admin + "x", digest)
    assert not verify_admin("", hash_key(""))
    assert not verify_admin(admin, "")


def test_bearer_header() -> None:
    assert bearer_token("Bearer abc.def") == "abc.def"
    assert bearer_token("bearer   xyz") == "xyz"
    for bad in ("", "Bearer", "Basic abc", "Bearer a b", "Bearerabc"):
        with pytest.raises(AuthFailed):
            bearer_token(bad)
