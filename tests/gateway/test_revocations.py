"""Revocations: what of a caller's was withdrawn after its RPC's stamp, within a bounded memory."""

from __future__ import annotations

import random

import pytest

from gateway.revocations import Revocations


def test_what_was_withdrawn_after_the_stamp_is_seen_and_nothing_before() -> None:
    revocations = Revocations()
    before = revocations.stamp()
    revocations.key_revoked("k1")
    revocations.tenant_deleted("acme")
    after = revocations.stamp()
    assert revocations.since(before, "acme", "k2") == "tenant"
    assert revocations.since(before, "beta", "k1") == "key"
    assert revocations.since(before, "beta", "k2") == ""
    assert revocations.since(after, "acme", "k1") == ""


def test_endless_withdrawals_are_remembered_within_the_bound() -> None:
    """DeleteTenant and RevokeKey run their clean-up for ids that are gone or never existed
    too: each such call kept an entry for the life of the process."""
    revocations = Revocations(kept=8)
    old = revocations.stamp()
    for i in range(1_000):
        revocations.tenant_deleted(f"ghost-{i}")
    assert len(revocations._at) == 8
    assert revocations.since(old, "acme", "k1") == "key"  # what it missed is forgotten: refused
    assert revocations.since(revocations.stamp(), "acme", "k1") == ""


@pytest.mark.parametrize("seed", range(4))
def test_blast_a_bounded_memory_never_answers_less_than_an_endless_one(seed: int) -> None:
    rng = random.Random(seed)
    bounded, endless = Revocations(kept=16), Revocations(kept=10**9)
    stamps = [0]
    for _ in range(5_000):
        roll = rng.random()
        if roll < 0.3:
            key_id = f"k{rng.randrange(40)}"
            bounded.key_revoked(key_id)
            endless.key_revoked(key_id)
        elif roll < 0.45:
            tenant_id = f"t{rng.randrange(40)}"
            bounded.tenant_deleted(tenant_id)
            endless.tenant_deleted(tenant_id)
        elif roll < 0.6:
            stamps.append(bounded.stamp())
        else:
            stamp = rng.choice(stamps[-30:])
            tenant_id, key_id = f"t{rng.randrange(40)}", f"k{rng.randrange(40)}"
            exact = endless.since(stamp, tenant_id, key_id)
            answer = bounded.since(stamp, tenant_id, key_id)
            assert answer or not exact  # never lets a withdrawn caller through
            if stamp >= bounded._forgotten:
                assert answer == exact
        assert len(bounded._at) <= 16
        assert bounded.stamp() == endless.stamp()
