"""API keys: generation, hashing, parsing and the `authorization: Bearer` header.

A tenant key reads `fg_<key_id>_<secret>`: `key_id` (16 hex digits) names the stored record, the
secret is 256 random bits. Stores keep only the SHA-256 digest of the whole key; an unsalted hash
is enough because the secret is random and far too long to guess. The admin key is not a tenant
key: the gateway settings hold its digest and `verify_admin` checks a presented key against it.
Comparisons are constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from tenants.errors import AuthFailed, RequestInvalid

TENANT_KEY_PREFIX = "fg_"
_KEY_ID = r"[0-9a-f]{16}"
_TENANT_KEY = re.compile(TENANT_KEY_PREFIX + rf"({_KEY_ID})_([A-Za-z0-9_-]{{43}})")
_BEARER = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +(\S+) *")


def new_key() -> tuple[str, str]:
    """A fresh tenant key: `(key_id, plaintext)`. Show the plaintext once, store its hash."""
    key_id = secrets.token_hex(8)
    return key_id, f"{key_prefix(key_id)}_{secrets.token_urlsafe(32)}"


def key_prefix(key_id: str) -> str:
    """What a tenant key shows before its secret (`fg_<key_id>`): safe to list and log."""
    return f"{TENANT_KEY_PREFIX}{key_id}"


def new_admin_key() -> str:
    return f"fgadmin_{secrets.token_urlsafe(32)}"


def hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def key_id_of(plaintext: str) -> str:
    """The key id inside a tenant key; AuthFailed when it is not shaped like one."""
    match = _TENANT_KEY.fullmatch(plaintext)
    if match is None:
        raise AuthFailed("malformed API key")
    return match.group(1)


def check_key_id(key_id: str) -> str:
    """A key id as `new_key` makes them; RequestInvalid (quoting none of it) otherwise."""
    if not isinstance(key_id, str) or re.fullmatch(_KEY_ID, key_id) is None:
        raise RequestInvalid("key id must be 16 hex digits (0-9, a-f)")
    return key_id


def key_matches(plaintext: str, key_hash: str) -> bool:
    return hmac.compare_digest(hash_key(plaintext), key_hash)


def verify_admin(plaintext: str, admin_key_hash: str) -> bool:
    """True when `plaintext` is the admin key whose digest is `admin_key_hash` (never for '')."""
    return bool(plaintext) and bool(admin_key_hash) and key_matches(plaintext, admin_key_hash)


def bearer_token(authorization: str) -> str:
    """The credential in an `authorization: Bearer <token>` metadata value."""
    match = _BEARER.fullmatch(authorization)
    if match is None:
        raise AuthFailed("expected 'authorization: Bearer <key>'")
    return match.group(1)
