"""Room on a remote backend: the scrape less the calls it has not seen yet."""

from __future__ import annotations

from gateway.backends.server_load import ServerLoad
from gateway.backends.unseen import UnseenCalls


def load(running: int = 0, waiting: int = 0, used: int = 0) -> ServerLoad:
    return ServerLoad(running, waiting, num_blocks=100, used_blocks=used, block_size=16, taken_at=0)


def test_a_call_sent_is_booked_as_waiting_with_its_slot_and_blocks() -> None:
    unseen = UnseenCalls()
    unseen.sent("a", prompt_tokens=20, output_tokens=13)  # 33 tokens: 3 blocks
    cap = unseen.capacity(load(running=2, used=10), max_num_seqs=8, healthy=True)
    assert (cap.free_blocks, cap.free_slots, cap.running, cap.waiting) == (87, 5, 2, 1)
    assert (cap.total_blocks, cap.block_size, cap.healthy) == (100, 16, True)


def test_a_call_stays_booked_until_a_scrape_started_after_the_server_showed_it() -> None:
    unseen = UnseenCalls()
    unseen.sent("a", 16, 16)
    early = unseen.scrape_started()  # before the call's first event
    unseen.shown("a")
    unseen.scraped(early)
    assert len(unseen) == 1
    late = unseen.scrape_started()
    unseen.scraped(late)
    assert len(unseen) == 0


def test_a_call_never_shown_stays_booked_through_scrapes_until_it_ends() -> None:
    unseen = UnseenCalls()
    unseen.sent("a", 16, 16)
    for _ in range(3):
        unseen.scraped(unseen.scrape_started())
    assert len(unseen) == 1
    unseen.ended("a")
    assert len(unseen) == 0


def test_a_new_prediction_resizes_the_booking() -> None:
    unseen = UnseenCalls()
    unseen.sent("a", prompt_tokens=16, output_tokens=16)
    unseen.resized("a", 48)
    assert unseen.capacity(load(), 8, True).free_blocks == 96
    unseen.resized("gone", 1000)  # a call that ended: nothing to resize
    assert unseen.capacity(load(), 8, True).free_blocks == 96


def test_room_never_goes_below_zero() -> None:
    unseen = UnseenCalls()
    for i in range(10):
        unseen.sent(f"c{i}", 160, 160)
    cap = unseen.capacity(load(running=5, used=90), max_num_seqs=8, healthy=True)
    assert (cap.free_blocks, cap.free_slots, cap.waiting) == (0, 0, 10)


def test_a_counted_call_that_ends_gives_its_room_back_until_a_later_scrape_lands() -> None:
    unseen = UnseenCalls()
    unseen.sent("a", prompt_tokens=20, output_tokens=12)  # 2 blocks
    unseen.shown("a")
    before_end = unseen.scrape_started()
    unseen.scraped(before_end)  # it counts "a" as running
    scraped = load(running=3, used=10)
    assert unseen.capacity(scraped, 8, True).free_slots == 5
    in_flight = unseen.scrape_started()  # started before the end: still counts "a"
    unseen.ended("a")
    cap = unseen.capacity(scraped, 8, True)
    assert (cap.free_slots, cap.running, cap.free_blocks) == (6, 2, 92)
    unseen.scraped(in_flight)
    assert unseen.capacity(scraped, 8, True).free_slots == 6  # that scrape still counted it
    unseen.scraped(unseen.scrape_started())  # a scrape after the end no longer counts it
    assert unseen.capacity(load(running=2, used=8), 8, True).free_slots == 6


def test_a_call_that_ends_before_any_scrape_counted_it_is_only_unbooked() -> None:
    unseen = UnseenCalls()
    unseen.sent("a", 16, 16)
    unseen.shown("a")
    unseen.ended("a")
    cap = unseen.capacity(load(running=3), 8, True)
    assert (cap.free_slots, cap.running, cap.waiting) == (5, 3, 0)
