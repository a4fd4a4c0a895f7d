import random

import pytest

from tenants.policies.fairshare import FairShareClock


def two_tenants() -> FairShareClock:
    """Tenant a (weight 1) and tenant b (weight 3), one job of cost 1000 each."""
    clock = FairShareClock()
    clock.add_job("a1", "a", 1.0, 1000.0)
    clock.add_job("b1", "b", 3.0, 1000.0)
    return clock


def test_the_lead_is_the_service_beyond_the_weighted_share_in_virtual_time() -> None:
    clock = two_tenants()
    clock.serve("a1", 400.0)  # GPS gives a 100 of it and b 300
    assert clock.lead("a") == pytest.approx((400.0 - 100.0) / 1.0)
    assert clock.lead("b") == pytest.approx((0.0 - 300.0) / 3.0)
    assert clock.virtual_time(400.0) == pytest.approx(100.0)
    clock.check_invariants()


def test_a_tenant_served_alone_does_not_lead() -> None:
    clock = FairShareClock()
    clock.add_job("a1", "a", 2.0, 1000.0)
    clock.serve("a1", 600.0)
    assert clock.lead("a") == pytest.approx(0.0)
    assert clock.virtual_time(600.0) == pytest.approx(300.0)


def test_gps_catches_up_with_a_tenant_served_ahead_while_the_others_are_served() -> None:
    clock = two_tenants()
    clock.serve("a1", 400.0)
    clock.serve("b1", 400.0)  # a gets 100 more under GPS, b 300
    assert clock.lead("a") == pytest.approx(400.0 - 200.0)
    assert clock.lead("b") == pytest.approx((400.0 - 600.0) / 3.0)


def test_a_tenant_gps_holds_nothing_of_starts_afresh() -> None:
    clock = two_tenants()
    clock.serve("a1", 1000.0)
    clock.release("a1")  # done in the real system; a ghost until GPS has served it too
    assert clock.lead("a") > 0.0
    clock.charge("b1", 5000.0)  # b's job costs 6000 after all
    clock.serve("b1", 4000.0)  # GPS finishes a's ghost on the way
    assert clock.lead("a") == 0.0
    assert clock.virtual_time(300.0) == pytest.approx(100.0)  # b alone is GPS-active
    clock.add_job("a2", "a", 1.0, 50.0)
    assert clock.lead("a") == 0.0
    clock.check_invariants()


def test_a_tenant_that_left_is_forgotten_however_large_virtual_time_has_grown() -> None:
    """Past V of about 1e14 (a long uptime), a departed tenant's last residue could sit below
    V's resolution: its finish never passed V again, and its share was kept for good, scanned
    on every step."""
    clock = FairShareClock()
    clock.add_job("old", "old", 1.0, 1e14)  # an uptime's worth of service: V goes to 1e14
    clock.serve("old", 1e14)
    clock.charge("old", 0.0)
    clock.release("old")
    draw = random.Random(0)
    jobs = [f"j{i}" for i in range(6)]
    for i, job in enumerate(jobs):  # two tenants come, are served a little, and leave
        clock.add_job(job, f"t{i % 2}", 1.0, draw.uniform(1e5, 1e7))
    for _ in range(50):
        clock.serve(draw.choice(jobs), draw.uniform(1e4, 1e6))
    for job in jobs:
        clock.release(job)
    clock.add_job("z", "fresh", 1.0, 1e13)
    clock.serve("z", 1e12)  # V passes every departed job's finish by far
    clock.virtual_time(0.0)
    clock.check_invariants()
    assert {share.tenant_id for share in clock._shares.values()} == {"fresh"}


def test_a_burst_of_re_keyed_costs_sorts_each_tenants_jobs_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each charge re-sorted all of its tenant's jobs: a backlog of a few thousand calls
    re-planned at once (a kind turned conservative) held the event loop for seconds. The tags
    are those of a clock read after every charge, computed once they are read."""
    from tenants.policies import fairshare

    sorts: list[int] = []
    finish_tags = fairshare._finish_tags

    def counting(share: fairshare._TenantShare) -> dict[str, float]:
        sorts.append(len(share.remaining))
        return finish_tags(share)

    each, burst = FairShareClock(), FairShareClock()
    for clock in (each, burst):
        for j in range(200):
            clock.add_job(f"j{j}", f"t{j % 2}", 1.0 + j % 2, 100.0 + j)
        clock.tag("j0")
    charges = [(f"j{j}", random.Random(j).uniform(-150.0, 150.0)) for j in range(0, 200, 3)]
    for job_id, delta in charges:
        each.charge(job_id, delta)
        each.tag(job_id)
    monkeypatch.setattr(fairshare, "_finish_tags", counting)
    for job_id, delta in charges:
        burst.charge(job_id, delta)
    assert sorts == []  # nothing sorted until a tag is read
    tags = {f"j{j}": burst.tag(f"j{j}") for j in range(200)}
    assert sorted(sorts) == [100, 100]  # then each tenant once
    burst.check_invariants()
    assert tags == pytest.approx({f"j{j}": each.tag(f"j{j}") for j in range(200)})
