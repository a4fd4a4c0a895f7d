"""The calls a dispatch core holds, by state and tenant (`gateway.call_book`)."""

from __future__ import annotations

from gateway.call_book import CallBook
from gateway.core_call import CoreCall
from tenants.policies import JobInfo, NodeCost, ReadyCall
from tests.gateway.factories import room


def info(job_id: str, tenant: str, weight: float = 1.0) -> JobInfo:
    node = NodeCost("n", (), 16, 16.0, 64)
    return JobInfo(job_id, tenant, weight, 0.0, (node,))


def entry(job_id: str, tenant: str, node: str = "n", backend: str = "") -> CoreCall[None]:
    call = ReadyCall(f"{job_id}/{node}", job_id, tenant, node, 16, 16.0, 64)
    return CoreCall(call, 64, None, backend=backend)


def test_a_tenant_s_entries_go_with_its_last_job_but_a_quota_hold_in_force_stays() -> None:
    book: CallBook[None] = CallBook()
    book.add_job(info("a", "t", weight=2.0))
    book.add_job(info("b", "t", weight=2.0))
    book.quota_until["t"] = 10.0
    assert book.remove_job("a", now=1.0) and book.has_tenant("t") and book.weight("t") == 2.0
    assert book.remove_job("b", now=1.0) and not book.has_tenant("t")
    assert book.weights == {} and book.quota_until == {"t": 10.0}  # its hold lasts till 10
    assert book.weight("t") == 1.0 and not book.remove_job("b", now=1.0)

    book.add_job(info("c", "t"))
    book.ready["c/n"] = ready = entry("c", "t")
    assert book.quota_holds("t", 5.0) and book.waiting_since(ready, 2.0) == 10.0
    del book.ready["c/n"]
    assert book.remove_job("c", now=11.0) and book.quota_until == {}  # lapsed: forgotten


def test_a_tenant_whose_ready_calls_are_all_of_held_jobs_can_send_none() -> None:
    book: CallBook[None] = CallBook()
    for job_id in ("a", "b"):
        book.add_job(info(job_id, "t"))
        book.ready[f"{job_id}/n"] = entry(job_id, "t")
    book.held_jobs.add("a")
    assert book.sendable("t") == 1 and list(book.shown_jobs("t")) == ["b"]
    book.held_jobs.add("b")
    assert book.sendable("t") == 0 and list(book.shown_jobs("t")) == []
    assert book.unheld_tenants(0.0) == ["t"]  # held jobs are the caller's; its quota is not
    book.quota_until["t"] = 1.0
    assert book.unheld_tenants(0.0) == []


def test_a_job_s_waiting_calls_leave_the_book_together_and_its_running_ones_stay() -> None:
    book: CallBook[None] = CallBook()
    book.add_job(info("j", "t"))
    book.ready["j/a"] = entry("j", "t", "a")
    book.taking["j/b"] = entry("j", "t", "b", backend="x")
    book.running["j/c"] = entry("j", "t", "c", backend="x")
    book.taking["k/a"] = entry("k", "u", "a", backend="x")
    gone = book.waiting_of("j")
    assert sorted(e.call.call_id for e in gone) == ["j/a", "j/b"]
    assert not book.ready and list(book.taking) == ["k/a"] and list(book.running) == ["j/c"]
    assert book.active_tenants() == {"t", "u"}


def test_the_newest_running_call_is_picked_on_a_backend_that_serves() -> None:
    book: CallBook[None] = CallBook()
    for name, backend in (("old", "x"), ("mid", "x"), ("new", "down")):
        book.running[f"j/{name}"] = entry("j", "t", name, backend=backend)
    rooms = {"x": room(), "down": room(healthy=False)}
    newest = book.newest(rooms, lambda e: True)
    assert newest is not None and newest.call.node_id == "mid"
    oldest = book.newest(rooms, lambda e: e.call.node_id == "old")
    assert oldest is not None and oldest.call.node_id == "old"
    assert book.newest({}, lambda e: True) is None  # no snapshot of its backend: not serving


def test_shares_count_the_calls_on_serving_backends_and_the_backlogged_tenants() -> None:
    book: CallBook[None] = CallBook()
    book.add_job(info("h", "heavy", weight=3.0))
    book.add_job(info("l", "light"))
    for k in range(3):
        book.running[f"h/{k}"] = entry("h", "heavy", str(k), backend="x")
    book.running["h/down"] = entry("h", "heavy", "down", backend="down")
    yielding = entry("h", "heavy", "y", backend="x")
    yielding.yielding = True
    book.running["h/y"] = yielding
    book.ready["l/n"] = entry("l", "light")
    rooms = {"x": room(), "down": room(healthy=False)}
    running, share = book.tenant_shares(rooms, 8)
    assert running == {"heavy": 3}  # not the call on the down backend, nor the yielding one
    assert share == {"heavy": 6.0, "light": 2.0}  # 8 slots by weight 3:1
    assert book.protected_tenants() == {"heavy"}
