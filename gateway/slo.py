"""The SLO monitor: latency targets, a violation rate over a window, and a degradation level.

Every call that starts streaming reports its time to first token, counted from when it became
ready (the wait in the gateway's queue is what overload adds; the time its tenant's own quota
held it back is not counted, `CallBook.waiting_since`), and, when it ends, its time per
output token. A call still waiting past its target is judged a miss at once (`overdue`), not
only when its first token comes: under overload that may be many seconds late, and the monitor
must see the queue grow while it grows. Better still, a call waiting for room is judged by the
wait it can expect: what it has waited plus one slot's turn for each protected call ahead of it
in its pool and itself, at the rate its pool's calls ended over the window (`ends_per_s`: pools
serve different models on different backends, and one's queue is no wait in another); so the
level rises while the queue that will miss is still forming, not a target's length after. A
call is judged against the target of its tenant (or the `*` target); calls of sheddable jobs
(negative priority) are not judged: they give way.
The monitor keeps the verdicts of the last `window_s` seconds and, once `min_calls` of them are
in, compares the share that missed with `threshold`:

    level 0  normal
    level 1  hold sheddable work back (negative-priority calls run only in slots beyond a
             reserve kept free for protected calls to come)
    level 2  also shrink the batch target (3/4 of the backends' slots) while most misses are
             per-token ones, so admitted calls stream faster (it would only lengthen the queue
             that slow first tokens come from)
    level 3  also refuse new jobs (UNAVAILABLE, ErrorInfo SLO_SHED, RetryInfo) while no
             slot is left for their first calls within 3/4 of the backends' slots: admission
             held to what the backends drain, with no queue for a slot, and a batch a quarter
             smaller (with no queue, shorter steps are faster first tokens too)

Over the threshold it escalates one level, at most once per `rise_s` (quickly: a queue that
grows past the targets grows fast); under half the threshold, or with too few verdicts to tell
(little is running), it steps back one level, at most once per `hold_s` (slowly: hysteresis, a
level is held long enough for its effect to show in the window before the load is let back),
and not within `hold_s` of the level's last act (`acted`: a job refused at level 3, the work
held back found to fill the room: calls at the shrunk batch at 2, sheddable ones at the reserve
at 1): while it acts, the load it holds back is still there, and letting it in would queue it
again. A lower level's act holds that level, not those above it (which would then hold
themselves: level 3's larger reserve is full of sheddable calls whenever any wait).
Pure: `now` is passed in; the dispatcher applies the levels and ticks it while nothing ends.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence, Set
from dataclasses import dataclass

MAX_LEVEL = 3
LEVEL_NAMES = ("normal", "holding sheddable work", "shrinking the batch", "refusing new jobs")


@dataclass(frozen=True, slots=True)
class SloTarget:
    tenant: str  # a tenant id, or "*" for every tenant without a target of its own
    ttft_s: float  # from ready to the first token
    tpot_s: float | None = None  # per output token after the first; None: not judged


@dataclass(frozen=True, slots=True)
class SloConfig:
    targets: tuple[SloTarget, ...]
    window_s: float = 10.0
    threshold: float = 0.1  # share of judged calls that may miss before the level rises
    min_calls: int = 20  # verdicts needed in the window before any change
    hold_s: float = 2.0  # the least time at a level before it steps down
    rise_s: float = 0.25  # the least time at a level before it steps up

    def __post_init__(self) -> None:
        if not (0 < self.threshold < 1) or self.window_s <= 0 or min(self.hold_s, self.rise_s) < 0:
            raise ValueError("need 0 < threshold < 1, window_s > 0, hold_s and rise_s >= 0")
        if self.min_calls < 1:
            raise ValueError("min_calls must be >= 1")
        for target in self.targets:
            positive = target.ttft_s > 0 and (target.tpot_s is None or target.tpot_s > 0)
            if not (positive and math.isfinite(target.ttft_s)):
                raise ValueError(f"SLO target of {target.tenant!r}: times must be > 0")


class SloMonitor:
    def __init__(self, config: SloConfig, now: float = 0.0) -> None:
        self.config = config
        self._targets = {t.tenant: t for t in config.targets}
        self._verdicts: deque[tuple[float, bool, bool]] = deque()  # (time, missed, per token)
        self._missed = 0
        self._slow_tokens = 0  # misses of per-token targets
        self._overdue: set[str] = set()  # calls judged before their first token
        self._ends: dict[str, deque[float]] = {}  # by pool, when calls ended over the window
        self.level = 0
        self._changed_at = now - max(config.hold_s, config.rise_s)
        self._acted_at: dict[int, float] = {}  # by level, when it last acted

    def first_token(
        self, call_id: str, tenant: str, sheddable: bool, ttft_s: float, now: float
    ) -> int:
        """A call's first token came `ttft_s` after it was ready; returns the level."""
        target = self._target(tenant, sheddable)
        if target is not None and call_id not in self._overdue:
            self._judge(ttft_s > target.ttft_s, now, per_token=False)
        self._overdue.discard(call_id)
        return self.update(now)

    def overdue(
        self, call_id: str, tenant: str, sheddable: bool, waited_s: float, now: float
    ) -> None:
        """A call has waited `waited_s` since it was ready, no token yet: past its target, it
        is a miss now (once; its first token is then not judged again)."""
        target = self._target(tenant, sheddable)
        if target is not None and waited_s > target.ttft_s and call_id not in self._overdue:
            self._overdue.add(call_id)
            self._judge(True, now, per_token=False)

    def still_waiting(self, call_ids: Set[str]) -> None:
        """Only these calls are still without a token: the others judged overdue are gone
        (their job cancelled, or dropped unserved) and are forgotten."""
        self._overdue &= call_ids

    @property
    def overdue_calls(self) -> int:
        """Calls judged past their TTFT target that have no token yet."""
        return len(self._overdue)

    def ended(
        self,
        call_id: str,
        tenant: str,
        sheddable: bool,
        tpot_s: float | None,
        now: float,
        pool: str,
    ) -> int:
        """A call of `pool` ended streaming one token per `tpot_s`; returns the level."""
        self._overdue.discard(call_id)
        self._ends.setdefault(pool, deque()).append(now)
        target = self._target(tenant, sheddable)
        if target is not None and target.tpot_s is not None and tpot_s is not None:
            self._judge(tpot_s > target.tpot_s, now, per_token=True)
        return self.update(now)

    def ends_per_s(self, now: float, pool: str) -> float:
        """How many calls of `pool` ended per second over the window: the rate room comes free
        there."""
        self._expire(now)
        return len(self._ends.get(pool, ())) / self.config.window_s

    def violation_rate(self, now: float) -> float | None:
        """The share of the window's verdicts that missed; None with too few of them."""
        self._expire(now)
        if len(self._verdicts) < self.config.min_calls:
            return None
        return self._missed / len(self._verdicts)

    def update(self, now: float) -> int:
        """Move the level one step when the window says so and the last change has held."""
        rate, since = self.violation_rate(now), now - self._changed_at
        config = self.config
        over = rate is not None and rate > config.threshold
        under = rate is None or rate < config.threshold / 2
        idle = now - self._acted_at.get(self.level, -math.inf) >= config.hold_s
        if over and self.level < MAX_LEVEL and since >= config.rise_s:
            self._set(self.level + 1, now)
        elif under and idle and self.level > 0 and since >= config.hold_s:
            self._set(self.level - 1, now)
        return self.level

    def acted(self, now: float, level: int) -> None:
        """What `level` does just acted (held load back): while the level is that one, it
        holds for `hold_s` more at least."""
        self._acted_at[level] = now

    def _set(self, level: int, now: float) -> None:
        self.level, self._changed_at = level, now

    def _target(self, tenant: str, sheddable: bool) -> SloTarget | None:
        if sheddable:
            return None
        return self._targets.get(tenant) or self._targets.get("*")

    def tokens_slow(self, now: float) -> bool:
        """Whether most of the window's misses are per-token ones (a fuller batch's cost,
        which a smaller batch cures; a long wait for the first token it does not)."""
        self._expire(now)
        return self._slow_tokens * 2 > self._missed

    def _judge(self, missed: bool, now: float, per_token: bool) -> None:
        self._verdicts.append((now, missed, per_token))
        self._missed += missed
        self._slow_tokens += missed and per_token

    def _expire(self, now: float) -> None:
        horizon = now - self.config.window_s
        for pool, ends in list(self._ends.items()):
            while ends and ends[0] < horizon:
                ends.popleft()
            if not ends:
                del self._ends[pool]
        while self._verdicts and self._verdicts[0][0] < horizon:
            _, missed, per_token = self._verdicts.popleft()
            self._missed -= missed
            self._slow_tokens -= missed and per_token


def expected_waits(ready_ats: Sequence[float], now: float, ends_per_s: float) -> list[float]:
    """The wait each call queued for room can expect in all, the queue in the order it is
    served (`ready_ats`, when each became ready): what it has waited plus one slot's turn for
    itself and each call ahead, a turn being how long a call takes to end at `ends_per_s`
    (none known: what it has waited)."""
    turn = 1.0 / ends_per_s if ends_per_s > 0 else 0.0
    return [now - ready_at + position * turn for position, ready_at in enumerate(ready_ats, 1)]
