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
