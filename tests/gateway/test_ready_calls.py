"""The ready calls' index answers what a scan of every ready call would."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from gateway.ready_calls import ReadyCalls
from tenants.policies import ReadyCall


@dataclass
class Entry:
    call: ReadyCall
    sheddable: bool


def entry(call_id: str, job_id: str, tenant_id: str, sheddable: bool = False) -> Entry:
    return Entry(ReadyCall(call_id, job_id, tenant_id, call_id, 1, 1.0, 1), sheddable)


# (add?, call, job, tenant, sheddable): a call id names one job of one tenant, as in the core
operations = st.lists(
    st.tuples(st.booleans(), st.integers(0, 30), st.booleans()).map(
        lambda op: (op[0], f"c{op[1]}", f"j{op[1] % 7}", f"t{op[1] % 7 % 3}", op[2])
    ),
    max_size=80,
)


@given(operations)
def test_the_index_matches_a_scan_after_any_adds_and_removals(ops: list) -> None:
    ready: ReadyCalls[Entry] = ReadyCalls()
    plain: dict[str, Entry] = {}
    for add, call_id, job_id, tenant_id, sheddable in ops:
        if add:
            plain.pop(call_id, None)  # added again, it comes last
            ready[call_id] = plain[call_id] = entry(call_id, job_id, tenant_id, sheddable)
        elif call_id in plain:
            assert ready.pop(call_id) is plain.pop(call_id)
    assert dict(ready) == plain and len(ready) == len(plain)
    jobs = {e.call.job_id for e in plain.values()}
    tenants = {e.call.tenant_id for e in plain.values()}
    assert set(ready.tenants()) == tenants
    for tenant in tenants | {"nobody"}:
        calls = [e for e in plain.values() if e.call.tenant_id == tenant]
        assert set(ready.jobs(tenant)) == {e.call.job_id for e in calls}
        assert ready.protected(tenant) == sum(not e.sheddable for e in calls)
    for job in jobs | {"none"}:
        assert ready.of_job(job) == [e for e in plain.values() if e.call.job_id == job]


def test_a_call_added_again_is_indexed_once() -> None:
    ready: ReadyCalls[Entry] = ReadyCalls()
    ready["c"] = entry("c", "j", "t")
    ready["c"] = entry("c", "j", "t")
    assert ready.of_job("j") == [ready["c"]] and ready.protected("t") == 1
    del ready["c"]
    assert not ready and list(ready.tenants()) == [] and ready.of_job("j") == []
    assert ready.protected("t") == 0
