"""Room on a remote backend: the scrape's other clients' part, plus the gateway's own calls."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from gateway.backends.base import blocks
from gateway.backends.own_calls import OwnCalls
from gateway.backends.server_load import ServerLoad


def load(running: int = 0, waiting: int = 0, used: int = 0) -> ServerLoad:
    return ServerLoad(running, waiting, num_blocks=100, used_blocks=used, block_size=16, taken_at=0)


def test_a_call_sent_holds_its_slot_and_blocks_beside_what_others_hold() -> None:
    own = OwnCalls()
    own.sent("a", prompt_tokens=20, output_tokens=13)  # 33 tokens: 3 blocks
    # the scrape started before "a" was sent: all it counts is other clients'
    cap = own.capacity(load(running=2, used=10), max_num_seqs=8, healthy=True)
    assert (cap.free_blocks, cap.free_slots, cap.running, cap.waiting) == (87, 5, 2, 1)
    assert (cap.total_blocks, cap.block_size, cap.healthy) == (100, 16, True)


def test_a_call_the_server_already_runs_is_not_counted_twice() -> None:
    """The server runs the gateway's call (its gauges count it) before the call's first token
    reaches the gateway: a scrape then must not leave its slot or its KV held twice."""
    own = OwnCalls()
    for call in ("a", "b", "c"):
        own.sent(call, prompt_tokens=16, output_tokens=16)  # 1 block held there, 2 at most
    own.scraped(own.scrape_started())
    cap = own.capacity(load(running=3, used=3), max_num_seqs=8, healthy=True)
    assert (cap.free_slots, cap.running, cap.waiting, cap.free_blocks) == (5, 3, 0, 94)


def test_calls_still_on_their_way_when_scraped_are_held_by_the_gateway() -> None:
    own = OwnCalls()
    for call in ("a", "b", "c"):
        own.sent(call, 16, 16)
    own.scraped(own.scrape_started())
    cap = own.capacity(load(running=1), max_num_seqs=8, healthy=True)  # two not there yet
    assert (cap.free_slots, cap.running, cap.waiting, cap.free_blocks) == (5, 1, 2, 94)


def test_other_clients_hold_what_the_scrape_counts_beyond_the_gateways_calls() -> None:
    own = OwnCalls()
    own.sent("a", 16, 16)
    own.scraped(own.scrape_started())
    own.sent("b", 16, 16)  # after the scrape started: in no scrape yet
    # 4 running, 2 waiting: "a" and five of others', with 20 blocks used, 1 of them "a"'s
    cap = own.capacity(load(running=4, waiting=2, used=20), max_num_seqs=8, healthy=True)
    assert (cap.free_slots, cap.running, cap.waiting, cap.free_blocks) == (1, 4, 3, 77)


def test_the_others_blocks_are_the_used_less_what_the_gateways_calls_hold_there() -> None:
    """Another replica's calls hold 600 blocks of the server; this one's ten calls have just
    started and hold their prompts there, not what they may grow to. Taking the latter off the
    used blocks counted the gap as free room, which the other replica's calls held."""
    own = OwnCalls()
    for i in range(10):
        own.sent(f"a{i}", prompt_tokens=16, output_tokens=640)  # 1 block held, 41 at most
    own.scraped(own.scrape_started())
    shared = ServerLoad(20, 0, num_blocks=1200, used_blocks=610, block_size=16, taken_at=0)
    assert own.capacity(shared, 64, True).free_blocks == 1200 - 600 - 10 * 41
    for i in range(10):
        own.streamed(f"a{i}", 32)  # 48 tokens: 3 blocks held each
    own.scraped(own.scrape_started())
    grown = replace(shared, used_blocks=630)
    assert own.capacity(grown, 64, True).free_blocks == 1200 - 600 - 10 * 41
    own.streamed("a0", 700)  # past its prediction: it may grow to 716 tokens, 45 blocks
    assert own.capacity(grown, 64, True).free_blocks == 1200 - 600 - 9 * 41 - 45


def test_a_call_that_ends_gives_its_room_back_at_once() -> None:
    own = OwnCalls()
    own.sent("a", prompt_tokens=20, output_tokens=12)  # 2 blocks
    own.sent("b", prompt_tokens=20, output_tokens=12)
    own.scraped(own.scrape_started())
    scraped = load(running=2, used=4)
    assert own.capacity(scraped, 8, True).free_slots == 6
    in_flight = own.scrape_started()  # started before the end: may still count "a"
    own.ended("a")
    cap = own.capacity(scraped, 8, True)
    assert (cap.free_slots, cap.running, cap.waiting, cap.free_blocks) == (7, 1, 0, 98)
    own.scraped(in_flight)
    assert own.capacity(scraped, 8, True).free_slots == 7  # that scrape still counted it
    own.scraped(own.scrape_started())
    assert own.capacity(load(running=1, used=2), 8, True).free_slots == 7
    own.ended("b")
    own.ended("b")  # a second end (an abort racing the stream's) changes nothing
    assert own.capacity(load(running=1, used=2), 8, True).free_slots == 8


def test_a_new_prediction_resizes_the_calls_blocks() -> None:
    own = OwnCalls()
    own.sent("a", prompt_tokens=16, output_tokens=16)
    own.resized("a", 48)
    assert own.capacity(load(), 8, True).free_blocks == 96
    own.resized("gone", 1000)  # a call that ended: nothing to resize
    assert own.capacity(load(), 8, True).free_blocks == 96


def test_room_never_goes_below_zero() -> None:
    own = OwnCalls()
    for i in range(10):
        own.sent(f"c{i}", 160, 160)
    cap = own.capacity(load(running=5, used=90), max_num_seqs=8, healthy=True)
    assert (cap.free_blocks, cap.free_slots, cap.running, cap.waiting) == (0, 0, 5, 10)


Op = tuple[str, int, int]  # (what, call, tokens)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["sent", "resized", "streamed", "ended", "scrape", "landed", "ask"]),
            st.integers(0, 5),
            st.integers(1, 200),
        ),
        max_size=60,
    ),
    st.sampled_from([1, 16, 128]),
)
def test_the_room_is_what_summing_the_calls_afresh_gives_after_any_sequence(
    ops: list[Op], size: int
) -> None:
    """The room is kept as calls come and go (a server may hold hundreds of the gateway's
    calls, and it is asked for its room on every dispatch): it always equals the sums taken
    afresh, at whichever block size the scrapes report."""
    own = OwnCalls()
    calls: dict[str, tuple[int, int, int]] = {}  # call -> (prompt, predicted, streamed)
    started: tuple[int, ...] = ()
    landed: tuple[int, ...] = ()
    for what, n, tokens in ops:
        call = f"c{n}"
        if what == "sent":
            own.sent(call, tokens, n)
            calls[call] = (tokens, n, 0)
        elif what == "resized":
            own.resized(call, tokens)
            if call in calls:
                calls[call] = (calls[call][0], tokens, calls[call][2])
        elif what == "streamed":
            own.streamed(call, tokens)
            if call in calls:
                calls[call] = (*calls[call][:2], tokens)
        elif what == "ended":
            own.ended(call)
            calls.pop(call, None)
        elif what == "scrape":
            started = own.scrape_started()
            assert sorted(started) == sorted(p + s for p, _, s in calls.values())
        elif what == "landed":
            own.scraped(started)
            landed = started
        block = size if what != "ask" else 1 + tokens % 64  # a server's block size changing
        scraped = ServerLoad(3, 2, num_blocks=10_000, used_blocks=400, block_size=block, taken_at=0)
        cap = own.capacity(scraped, max_num_seqs=8, healthy=True)
        mine = sum(blocks(p + max(o, s), block) for p, o, s in calls.values())
        marked = sum(blocks(t, block) for t in landed)
        assert cap.free_blocks == 10_000 - max(400 - marked, 0) - mine
        assert cap.free_slots == max(8 - max(5 - len(landed), 0) - len(calls), 0)
