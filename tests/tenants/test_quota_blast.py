"""Seeded blast: hundreds of concurrent calls reserve, renew their lease, then settle, release
or vanish, while random cancellations cut them off mid-request; afterwards usage is exactly the
settled calls, late settles of reclaimed calls included.

A call whose request was cancelled cleans up as the gateway does: a shielded release. Settle
and release close a call exactly once, so the cleanup's answer tells whether the cancelled
settle took effect (release False) or not (release True). That reading needs the reservation
not to have expired meanwhile, so only calls with a long lease have their settle cancelled: a
long TTL, or a short one renewed in time.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import anyio
import anyio.lowlevel
import pytest

from tenants import CallClosed, QuotaExceeded, QuotaLimit, TenantQuota
from tests.tenants.conftest import Harness

pytestmark = pytest.mark.anyio

_T = TypeVar("_T")
NUM_CALLS = 300
MAX_ATTEMPTS = 20  # a refused call retries, as the dispatch loop would
LONG_TTL_S = 1000.0  # longer than the blast runs, hand-driven clock included
QUOTA = TenantQuota(tokens_per_minute=3_000, max_concurrent_calls=8)


@dataclass
class Tally:
    input_tokens: int = 0
    output_tokens: int = 0
    settled_calls: int = 0
    cancelled: int = 0
    refused: dict[QuotaLimit, int] = field(default_factory=dict)
    opened: list[str] = field(default_factory=list)  # reserved, the answer seen

    def settled(self, input_tokens: int, output_tokens: int) -> None:
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.settled_calls += 1


async def maybe_cancelled(
    rng: random.Random, tally: Tally, op: Callable[[], Awaitable[_T]]
) -> tuple[bool, _T | None]:
    """Run `op`, cancelling it at a random moment a third of the time: (cancelled, result)."""
    if rng.random() >= 1 / 3:
        return False, await op()
    result: _T | None = None
    with anyio.move_on_after(rng.choice([0.0, rng.uniform(0.0, 0.002)])) as scope:
        result = await op()
    if scope.cancelled_caught:
        tally.cancelled += 1
    return scope.cancelled_caught, result


async def one_call(h: Harness, rng: random.Random, index: int, tally: Tally) -> None:
    call_id, tokens = f"call-{index}", rng.randint(1, 200)
    roll = rng.random()
    abandoned, short = roll < 0.1, roll < 0.3
    ttl = h.tiny_ttl_s if abandoned else (short_ttl_s(h) if short else LONG_TTL_S)
    for _ in range(MAX_ATTEMPTS):
        for _ in range(rng.randint(1, 50)):  # back off: let the others move
            await anyio.lowlevel.checkpoint()
        try:
            cancelled, _ = await maybe_cancelled(
                rng, tally, lambda: h.store.reserve("acme", call_id, tokens, ttl)
            )
            break
        except QuotaExceeded as refusal:
            tally.refused[refusal.limit] = tally.refused.get(refusal.limit, 0) + 1
            h.advance(0.05)
    else:
        return
    if cancelled:
        with anyio.CancelScope(shield=True):
            await h.store.release("acme", call_id)
        return
    tally.opened.append(call_id)
    h.advance(rng.uniform(0.0, 0.02))
    if abandoned:
        return
    if rng.random() < 0.3:
        lost = await h.store.renew("acme", calls=[call_id], ttl_s=LONG_TTL_S)
        assert lost in ([], [call_id])
        short = short and bool(lost)  # a kept lease now outlives the blast
    await settle_or_release(h, rng, call_id, tokens, short, tally)


async def settle_or_release(
    h: Harness, rng: random.Random, call_id: str, tokens: int, short: bool, tally: Tally
) -> None:
    if rng.random() < 0.4:
        await h.store.release("acme", call_id)
        return
    input_tokens = rng.randint(0, tokens)
    output_tokens = rng.randint(0, tokens - input_tokens) + (
        rng.randint(1, 50) * (rng.random() < 0.1)
    )
    if short:
        if await h.store.settle("acme", call_id, input_tokens, output_tokens):
            tally.settled(input_tokens, output_tokens)
        return
    cancelled, settled = await maybe_cancelled(
        rng, tally, lambda: h.store.settle("acme", call_id, input_tokens, output_tokens)
    )
    if cancelled:
        with anyio.CancelScope(shield=True):
            settled = not await h.store.release("acme", call_id)
    else:
        assert settled, "a call whose lease held settles"
    if settled:
        tally.settled(input_tokens, output_tokens)


def short_ttl_s(h: Harness) -> float:
    """Runs out during the blast for some calls: ~6 s of hand-driven clock pass on memory."""
    return 0.005 if h.is_redis else 2.0


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_blast_leaves_usage_equal_to_settled_calls(harness: Harness, seed: int) -> None:
    h = harness
    await h.store.create_tenant("acme", "Acme", QUOTA)
    rng = random.Random(seed)
    tally = Tally()
    async with anyio.create_task_group() as tg:
        for index in range(NUM_CALLS):
            tg.start_soon(one_call, h, random.Random(rng.random()), index, tally)
    h.advance(2 * h.tiny_ttl_s)  # the abandoned calls' TTL runs out

    usage = await h.store.usage("acme")
    assert (usage.settled_calls, usage.input_tokens, usage.output_tokens) == (
        tally.settled_calls,
        tally.input_tokens,
        tally.output_tokens,
    )
    assert (usage.active_reservations, usage.reserved_tokens) == (0, 0)
    assert usage.tokens_today == tally.input_tokens + tally.output_tokens
    capacity = QUOTA.tokens_per_minute
    assert usage.bucket_level is not None
    assert capacity - usage.tokens_today <= usage.bucket_level <= capacity
    assert tally.settled_calls > 10 and tally.cancelled > 10
    assert tally.refused.get(QuotaLimit.CONCURRENT_CALLS, 0) > 0
    assert tally.refused.get(QuotaLimit.TOKEN_RATE, 0) > 0
    for call_id in tally.opened:  # every call closed for good, abandoned ones included
        with pytest.raises(CallClosed):
            await h.store.reserve("acme", call_id, 1, LONG_TTL_S)
