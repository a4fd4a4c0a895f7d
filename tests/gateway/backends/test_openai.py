"""The openai backend against a real `fairgate engine serve` app (the simulated engine)."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from engine import FinishReason
from gateway.backends import (
    BackendLost,
    BackendRefused,
    BackendUnreachable,
    CallUsage,
    OpenAIBackend,
)
from tests.fake_clock import FakeClock
from tests.gateway.backends.conftest import (
    BLOCK_SIZE,
    NUM_BLOCKS,
    SLOW_STEP_S,
    Remote,
    backend_on,
    chunk,
    make_call,
    remote,
    scraped_until,
    sse,
    usage_chunk,
)
from tests.gateway.backends.proxy import cuttable_proxy

pytestmark = pytest.mark.anyio


async def test_a_call_streams_its_tokens_and_ends_with_the_servers_usage(
    server: Remote, tokenizer_dir: Path
) -> None:
    async with backend_on(server.url, tokenizer_dir) as backend:
        stream = backend.submit(make_call("call-1", prompt_len=20, max_tokens=12))
        deltas = [delta async for delta in stream]
    assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
    assert deltas[-1].finish_reason is FinishReason.LENGTH
    token_ids = [t for d in deltas for t in d.token_ids]
    assert stream.usage == CallUsage(prompt_tokens=20, completion_tokens=12, reported=True)
    assert len(token_ids) == 12
    # the same request id and prompt make the same tokens: these are the server's
    body = {"prompt": list(range(1, 21)), "max_tokens": 12, "request_id": "call-1"}
    direct = await server.http.post("/v1/completions", json=body | {"return_token_ids": True})
    choice = direct.json()["choices"][0]
    assert choice["token_ids"] == token_ids
    assert "".join(d.text for d in deltas) == choice["text"]


# The simulated server's tokens for this call id spell U+0085 (NEL) at the 61st character of its
# text. JSON may carry NEL, U+2028 and U+2029 unescaped (vLLM does), and any model may write them;
# server-sent events end lines only at CR and LF, while httpx's `aiter_lines` ends them at those
# too, which cut the event in two: the call was lost, and lost again where it ran next.
SEPARATOR_CALL = "call-5919"


async def test_text_with_a_unicode_line_separator_streams_whole(
    server: Remote, tokenizer_dir: Path
) -> None:
    server.gate.raw_separators = True
    async with backend_on(server.url, tokenizer_dir) as backend:
        stream = backend.submit(make_call(SEPARATOR_CALL, prompt_len=20, max_tokens=64))
        deltas = [delta async for delta in stream]
    body = {"prompt": list(range(1, 21)), "max_tokens": 64, "request_id": SEPARATOR_CALL}
    text = (await server.http.post("/v1/completions", json=body)).json()["choices"][0]["text"]
    assert "\u0085" in text  # else the case is not exercised: pick another call id
    assert "".join(d.text for d in deltas) == text
    assert deltas[-1].finished and stream.usage == CallUsage(20, 64, reported=True)


@pytest.mark.engine_step_s(SLOW_STEP_S)
async def test_capacity_holds_a_call_once_from_sent_to_scraped_and_frees_it_after(
    server: Remote, tokenizer_dir: Path
) -> None:
    async with backend_on(server.url, tokenizer_dir, max_num_seqs=8) as backend:
        idle = backend.capacity()
        assert idle.healthy and (idle.running, idle.waiting, idle.free_slots) == (0, 0, 8)
        assert idle.free_blocks == idle.total_blocks == NUM_BLOCKS
        stream = backend.submit(make_call(prompt_len=40, max_tokens=500))
        sent = backend.capacity()  # held at once, before any scrape: 540 tokens
        reserved = (540 + BLOCK_SIZE - 1) // BLOCK_SIZE
        assert (sent.running, sent.waiting, sent.free_slots) == (0, 1, 7)
        assert sent.free_blocks == NUM_BLOCKS - reserved
        await anext(aiter(stream))
        # a scrape that counts it shows it running: its one slot, not a second one
        await scraped_until(backend, lambda: backend.capacity().running == 1)
        running = backend.capacity()
        assert (running.waiting, running.free_slots) == (0, 7)
        assert backend.load is not None and 0 < backend.load.used_blocks < reserved
        # what it may grow to stays held; a block more where it crossed into one between the
        # scrape's start and the server's gauge (counted as another client's till the next)
        assert NUM_BLOCKS - reserved - 1 <= running.free_blocks <= NUM_BLOCKS - reserved
        await stream.aclose()
        await scraped_until(backend, lambda: backend.capacity() == idle)


async def test_a_shared_servers_kv_is_the_others_as_scraped_and_a_calls_as_it_may_grow(
    server: Remote, tokenizer_dir: Path
) -> None:
    """Another replica's calls hold 100 blocks of the server; this one's call holds its prompt
    and the tokens it streamed there. Taking what the call may grow to off the scrape's used
    blocks counted the gap as free, though the other replica's calls held it."""

    async def answer(body: dict[str, Any]) -> AsyncIterator[bytes]:
        yield chunk(range(65, 81), "A" * 16)  # with the prompt's 20 tokens: 3 blocks
        await over.wait()

    over = anyio.Event()
    server.gate.script = answer
    text = (await server.http.get("/metrics")).text
    usage = 'vllm:kv_cache_usage_perc{engine="0",model_name="fairgate-sim"}'
    assert f"{usage} 0.0" in text
    server.gate.metrics = text.replace(f"{usage} 0.0", f"{usage} {103 / NUM_BLOCKS}").encode()
    async with backend_on(server.url, tokenizer_dir) as backend:
        stream = backend.submit(make_call(prompt_len=20, max_tokens=500))  # 33 blocks at most
        await anext(aiter(stream))
        await backend.next_scrape()  # one that may have started before the tokens came
        await backend.next_scrape()
        assert backend.load is not None and backend.load.used_blocks == 103
        assert backend.capacity().free_blocks == NUM_BLOCKS - 100 - 33
        await stream.aclose()
    over.set()


@pytest.mark.engine_step_s(SLOW_STEP_S)
@pytest.mark.parametrize("how", ["close", "abort"])
async def test_stopping_a_call_early_aborts_it_on_the_server(
    server: Remote, tokenizer_dir: Path, how: str
) -> None:
    async with backend_on(server.url, tokenizer_dir) as backend:
        stream = backend.submit(make_call("call-9", max_tokens=500))  # 10 s if left to run
        first = await anext(aiter(stream))
        assert first.token_ids and (await server.metrics())["vllm:num_requests_running"] == 1
        if how == "close":
            await stream.aclose()
        else:
            backend.abort("call-9")
            assert [delta async for delta in stream] == []  # ends quietly: not lost

        async def freed() -> bool:
            load = backend.load
            return load is not None and load.running == 0 and server.engine.num_live == 0

        await scraped_until(backend, freed)
        generated = (await server.metrics())["vllm:generation_tokens_total"]
        assert generated < 500
        assert stream.usage is not None and not stream.usage.reported
        assert 1 <= stream.usage.completion_tokens <= generated


@pytest.mark.engine_step_s(SLOW_STEP_S)
async def test_a_server_lost_mid_stream_raises_backend_lost_and_opens_the_breaker(
    server: Remote, tokenizer_dir: Path
) -> None:
    async with (
        cuttable_proxy(server.port) as proxy,
        backend_on(proxy.url, tokenizer_dir, breaker_failures=2) as backend,
    ):
        stream = backend.submit(make_call(max_tokens=500))
        received = len((await anext(aiter(stream))).token_ids)
        proxy.cut()  # as if the server died: its connections drop, new ones are refused
        with pytest.raises(BackendLost):
            async for delta in stream:
                received += len(delta.token_ids)
        assert stream.usage is not None
        assert stream.usage == CallUsage(20, stream.usage.completion_tokens, reported=False)
        assert stream.usage.completion_tokens >= received
        await scraped_until(backend, lambda: not backend.capacity().healthy)  # /health fails
        with pytest.raises(BackendLost):
            [delta async for delta in backend.submit(make_call("call-2"))]
        assert backend._breaker.allows() is False  # two losses in a row


@pytest.mark.engine_step_s(SLOW_STEP_S)
async def test_a_server_that_fails_every_call_once_it_streams_opens_the_breaker(
    server: Remote, tokenizer_dir: Path
) -> None:
    """A call's first event was taken as the server working, so one that streamed a token and
    then failed every call (a crash in decoding) reset the count of failures each time: the
    breaker never opened, and every call sent there was lost and ran again elsewhere."""
    async with (
        cuttable_proxy(server.port) as proxy,
        backend_on(proxy.url, tokenizer_dir, breaker_failures=2) as backend,
    ):
        proxy.break_replies_to(b"/v1/completions")
        for call in ("call-1", "call-2"):
            assert backend._breaker.allows()
            stream = backend.submit(make_call(call, max_tokens=500))
            with pytest.raises(BackendLost):
                async for delta in stream:
                    assert not delta.finished
            assert stream.usage is not None and stream.usage.completion_tokens >= 1
        assert backend.capacity().healthy is False  # /health and /metrics answer: the breaker
        assert backend._breaker.allows() is False


async def test_stale_metrics_make_it_unhealthy_until_a_scrape_lands(
    server: Remote, tokenizer_dir: Path
) -> None:
    clock = FakeClock()
    async with backend_on(server.url, tokenizer_dir, clock=clock) as backend:
        assert backend.capacity().healthy
        server.gate.failing["/metrics"] = 503
        await backend.next_scrape()
        assert backend.capacity().healthy  # the last snapshot is still fresh
        clock.advance(backend.stale_after_s + 0.001)
        assert not backend.capacity().healthy
        server.gate.failing.clear()
        await scraped_until(backend, lambda: backend.capacity().healthy)


async def test_a_failing_health_check_makes_it_unhealthy(
    server: Remote, tokenizer_dir: Path
) -> None:
    async with backend_on(server.url, tokenizer_dir) as backend:
        server.gate.failing["/health"] = 503
        await scraped_until(backend, lambda: not backend.capacity().healthy)
        server.gate.failing.clear()
        await scraped_until(backend, lambda: backend.capacity().healthy)


async def test_it_is_down_from_the_first_scrape_that_finds_it_not_serving(
    server: Remote, tokenizer_dir: Path
) -> None:
    """How long it has not served, for the pool's refusal of new jobs: counted from the scrape
    that first found it down, not from a later one, and forgotten once it serves again."""
    clock = FakeClock()
    async with backend_on(server.url, tokenizer_dir, clock=clock) as backend:
        assert backend.down_for() is None
        server.gate.failing["/health"] = 503
        clock.advance(1.0)  # /health is due again
        await scraped_until(backend, lambda: backend.down_for() is not None)
        assert backend.down_for() == 0.0  # the clock stood still since that scrape
        clock.advance(7.0)
        await backend.next_scrape()  # still down: the time runs on from the first
        assert backend.down_for() == 7.0
        server.gate.failing.clear()
        await scraped_until(backend, lambda: backend.down_for() is None)


async def test_health_is_polled_every_health_interval_while_it_answers_at_every_scrape_while_not(
    server: Remote, tokenizer_dir: Path
) -> None:
    """Every scrape polled /health too: at vLLM's 10 scrapes a second, a third of the
    gateway's scrape work and as many requests the server answered."""
    clock = FakeClock()
    async with backend_on(server.url, tokenizer_dir, clock=clock, health_interval_s=1.0) as backend:
        polls = server.gate.seen["/health"]
        scrapes = server.gate.seen["/metrics"]
        for _ in range(3):
            await backend.next_scrape()
        assert server.gate.seen["/metrics"] >= scrapes + 3
        assert server.gate.seen["/health"] == polls  # not yet due
        server.gate.failing["/health"] = 503
        clock.advance(1.0)
        await scraped_until(backend, lambda: not backend.capacity().healthy)
        server.gate.failing.clear()
        await scraped_until(backend, lambda: backend.capacity().healthy)  # the clock stood still
        polls = server.gate.seen["/health"]
        for _ in range(3):
            await backend.next_scrape()
        assert server.gate.seen["/health"] == polls


@pytest.mark.parametrize("status", [429, 502, 503, 504])
async def test_busy_or_away_answers_are_lost_calls_that_open_the_breaker_until_a_trial_succeeds(
    server: Remote, tokenizer_dir: Path, status: int
) -> None:
    clock = FakeClock()
    overrides = {"breaker_failures": 2, "breaker_cooldown_s": 30.0}
    async with backend_on(server.url, tokenizer_dir, clock=clock, **overrides) as backend:
        server.gate.failing["/v1/completions"] = status
        for i in range(2):
            assert backend.capacity().healthy
            with pytest.raises(BackendLost, match=str(status)):
                [delta async for delta in backend.submit(make_call(f"call-{i}"))]
        assert not backend.capacity().healthy
        server.gate.failing.clear()
        clock.advance(30.0)
        # half-open (once a snapshot fresh by the moved clock is in): one trial may go
        await scraped_until(backend, lambda: backend.capacity().healthy)
        # room for the trial alone: the dispatcher took as many calls as the server had room
        # for, in one pass, and sent them all before the trial's verdict
        assert backend.capacity().free_slots == 1
        trial = backend.submit(make_call("trial"))
        assert not backend.capacity().healthy  # only one
        assert [d async for d in trial][-1].finished
        assert backend.capacity().healthy and backend.capacity().free_slots > 1


async def test_calls_the_server_fails_are_lost_but_never_open_the_breaker(
    server: Remote, tokenizer_dir: Path
) -> None:
    """A 500 says the server failed that call, which may be the call's doing: a tenant whose
    calls all fail so must not stop the server for the others, however many it sends at once."""
    async with backend_on(server.url, tokenizer_dir, breaker_failures=2) as backend:
        server.gate.failing["/v1/completions"] = 500
        streams = [backend.submit(make_call(f"poison-{i}")) for i in range(6)]
        for stream in streams:
            with pytest.raises(BackendLost, match="500") as lost:
                [delta async for delta in stream]
            assert lost.value.answered
        assert backend.capacity().healthy
        server.gate.failing.clear()
        assert [d async for d in backend.submit(make_call("honest"))][-1].finished


async def test_a_refused_call_fails_with_the_servers_reason_and_spares_the_breaker(
    server: Remote, tokenizer_dir: Path
) -> None:
    async with backend_on(server.url, tokenizer_dir, breaker_failures=1) as backend:
        call = make_call()
        call.prompt_ids[0] = 10**6  # out of the vocabulary
        with pytest.raises(BackendRefused, match="prompt token ids must be in") as refused:
            [delta async for delta in backend.submit(call)]
        assert refused.value.status == 400
        assert backend.capacity().healthy


@pytest.mark.engine_step_s(SLOW_STEP_S)
async def test_an_attempt_is_its_own_request_while_the_server_holds_the_last(
    server: Remote, tokenizer_dir: Path
) -> None:
    """A call run again (its backend lost it, or it yielded its slot) is sent while the server
    may not yet have seen the last attempt's client go: under the same request id the server
    would refuse it (409 here, 400 on vLLM) and the call would fail."""
    body = {"prompt": list(range(1, 21)), "max_tokens": 500, "stream": True}
    async with server.http.stream(
        "POST", "/v1/completions", json=body | {"request_id": "call-1"}
    ) as held:  # the server still runs the first attempt under the call's id
        assert held.status_code == 200
        async with backend_on(server.url, tokenizer_dir) as backend:
            again = replace(make_call("call-1", max_tokens=4), attempt_id="call-1#2")
            assert [d async for d in backend.submit(again)][-1].finished


MALFORMED = {  # events that are JSON but no completion chunk a server would send
    "not an object": [sse([1, 2])],
    "a token id that is no number": [chunk(["x"], "A")],  # type: ignore[list-item]
    "usage without its completion tokens": [
        chunk([65], "A", finish="length"),
        sse({"choices": [], "usage": {"prompt_tokens": 20}}),
    ],
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_a_malformed_event_loses_the_call_not_the_backend(
    server: Remote, tokenizer_dir: Path, case: str
) -> None:
    """What a server sends is read as untrusted: a chunk of the wrong shape loses that call; it
    once escaped the call's task and ended the task group of the backend, and the gateway's."""

    async def answer(body: dict[str, Any]) -> AsyncIterator[bytes]:
        for event in MALFORMED[case]:
            yield event

    server.gate.script = answer
    async with backend_on(server.url, tokenizer_dir) as backend:
        with pytest.raises(BackendLost, match="not a completion chunk"):
            [delta async for delta in backend.submit(make_call("bad"))]
        server.gate.script = None
        assert [d async for d in backend.submit(make_call("good"))][-1].finished


async def test_a_stream_cut_after_its_call_finished_spares_the_backend(
    server: Remote, tokenizer_dir: Path
) -> None:
    """The finished delta was handed out and its reader gone when the connection drops before
    `[DONE]`: the lost stream has nobody to tell, and telling nobody must not fail the task."""
    answered = anyio.Event()

    async def answer(body: dict[str, Any]) -> AsyncIterator[bytes]:
        yield chunk([65], "A")
        yield chunk([66], "B", finish="length")
        yield usage_chunk(len(body["prompt"]), 2)
        await answered.wait()
        raise RuntimeError("the server died before [DONE]")  # the connection drops

    server.gate.script = answer
    async with backend_on(server.url, tokenizer_dir) as backend:
        first = backend.submit(make_call("first", max_tokens=2))
        assert [d async for d in first][-1].finished
        answered.set()
        with anyio.fail_after(5):
            await first._control.ended.wait()  # type: ignore[attr-defined]
        server.gate.script = None
        assert [d async for d in backend.submit(make_call("second"))][-1].finished


async def test_metrics_past_any_servers_fail_the_scrape_not_the_backend(
    server: Remote, tokenizer_dir: Path
) -> None:
    """A KV use of 1e308 overflowed the blocks it was multiplied by: the scrape's task raised,
    and with it the backend's task group and the gateway; a `/metrics` answer of any length was
    read whole."""
    text = (await server.http.get("/metrics")).content
    async with backend_on(server.url, tokenizer_dir) as backend:
        for hostile in (
            text.replace(
                b"vllm:kv_cache_usage_perc{", b'vllm:kv_cache_usage_perc{x="1"} 1e308\n#{'
            ),
            text + b"# " + b"x" * (16 << 20) + b"\n",
        ):
            server.gate.metrics = hostile
            await scraped_until(backend, lambda: not backend.capacity().healthy)
            server.gate.metrics = None
            await scraped_until(backend, lambda: backend.capacity().healthy)
            assert [d async for d in backend.submit(make_call())][-1].finished


@pytest.mark.parametrize("path", ["/metrics", "/health"])
async def test_a_scrape_is_bounded_in_time_though_the_server_answers_a_line_at_a_time(
    server: Remote, tokenizer_dir: Path, path: str
) -> None:
    """The client's timeout bounds each read: an answer that never ends, a line at a time, held
    the scrape (the first one, so the backend never opened; a later one, so its snapshot went
    stale while it was never found down, and its pool never refused new jobs)."""

    async def endless() -> AsyncIterator[bytes]:
        while not over.is_set():  # (then the test's server stops at once)
            yield b"# still here\n"
            await anyio.sleep(0.01)

    over = anyio.Event()
    server.gate.bodies[path] = endless
    with anyio.fail_after(10):
        async with backend_on(server.url, tokenizer_dir) as backend:
            assert not backend.capacity().healthy and backend.down_for() is not None
            del server.gate.bodies[path]
            await scraped_until(backend, lambda: backend.capacity().healthy)
    over.set()


async def test_a_compressed_metrics_answer_fails_the_scrape_not_the_gateways_memory(
    server: Remote, tokenizer_dir: Path
) -> None:
    """`/metrics` answers were capped by the bytes that came, but read as they decode: 17 KiB
    of gzip are 17 MiB of text past the cap (16 MiB of it 16 GiB), all read into memory."""
    text = (await server.http.get("/metrics")).content
    server.gate.metrics = gzip.compress(text + b"# " + b"x" * (17 << 20) + b"\n")
    server.gate.metrics_encoding = b"gzip"
    async with backend_on(server.url, tokenizer_dir) as backend:
        assert backend.load is None and not backend.capacity().healthy
        server.gate.metrics = server.gate.metrics_encoding = None
        await scraped_until(backend, lambda: backend.capacity().healthy)


async def test_a_servers_usage_is_settled_within_the_calls_max_tokens(
    server: Remote, tokenizer_dir: Path
) -> None:
    async def answer(body: dict[str, Any]) -> AsyncIterator[bytes]:
        yield chunk([65, 66], "AB")
        yield chunk([67], "C", finish="length")
        yield usage_chunk(len(body["prompt"]), 10**9)
        yield sse("[DONE]")

    server.gate.script = answer
    async with backend_on(server.url, tokenizer_dir) as backend:
        stream = backend.submit(make_call(max_tokens=3))
        assert [d async for d in stream][-1].finished
    assert stream.usage == CallUsage(prompt_tokens=20, completion_tokens=3, reported=True)


async def test_a_whole_answer_frees_its_room_though_the_server_leaves_it_open(
    server: Remote, tokenizer_dir: Path
) -> None:
    """The call's task read on past `[DONE]` until the server closed the answer: one that left
    it open held the call's room for the read timeout (120 s), then failed it as lost, opening
    the breaker over calls that had all succeeded."""

    async def answer(body: dict[str, Any]) -> AsyncIterator[bytes]:
        yield chunk([65], "A", finish="length")
        yield usage_chunk(len(body["prompt"]), 1)
        yield sse("[DONE]")
        yield sse("more, after the end")
        await over.wait()  # (then the test's server stops at once)

    over = anyio.Event()
    server.gate.script = answer
    async with backend_on(server.url, tokenizer_dir, breaker_failures=1) as backend:
        idle = backend.capacity()
        for call_id in ("one", "two"):
            assert [d async for d in backend.submit(make_call(call_id, max_tokens=1))][-1].finished
        await scraped_until(backend, lambda: backend.capacity() == idle)
    over.set()


async def test_an_answer_longer_than_a_call_can_make_loses_it(
    server: Remote, tokenizer_dir: Path
) -> None:
    """A line that never ends was kept whole in memory, as long as the server sent it."""

    async def answer(body: dict[str, Any]) -> AsyncIterator[bytes]:
        yield b"data: "
        for _ in range(64):  # 4 MiB, then the line stays open
            yield b"x" * (1 << 16)
            await anyio.lowlevel.checkpoint()
        await over.wait()  # (then the test's server stops at once)

    over = anyio.Event()
    server.gate.script = answer
    async with backend_on(server.url, tokenizer_dir) as backend:
        with anyio.fail_after(10), pytest.raises(BackendLost, match="longer than"):
            [delta async for delta in backend.submit(make_call(max_tokens=8))]
    over.set()


async def test_a_call_that_brings_no_token_for_the_read_timeout_is_lost(
    server: Remote, tokenizer_dir: Path
) -> None:
    """A hung server that keeps the answer busy with keep-alive comments and empty chunks never
    let the read timeout fire: the call held its room for ever."""

    async def answer(body: dict[str, Any]) -> AsyncIterator[bytes]:
        yield chunk([65], "A")
        while not over.is_set():
            yield b": keep-alive\n\n" + chunk([], "")
            await anyio.sleep(0.01)

    over = anyio.Event()
    server.gate.script = answer
    async with backend_on(server.url, tokenizer_dir, read_timeout_s=0.3) as backend:
        stream = backend.submit(make_call(max_tokens=8))
        with anyio.fail_after(5), pytest.raises(BackendLost, match=r"no token for 0\.3 s"):
            [delta async for delta in stream]
    over.set()


async def test_a_call_the_server_aborts_is_lost_not_finished(
    server: Remote, tokenizer_dir: Path
) -> None:
    """vLLM ends a call it dropped itself with the finish reason `abort`: cut short, not done,
    so it must not succeed with what it had (nor be charged, nor teach the predictor)."""

    async def answer(body: dict[str, Any]) -> AsyncIterator[bytes]:
        yield chunk([65, 66, 67], "ABC")
        yield chunk(finish="abort")
        yield usage_chunk(len(body["prompt"]), 3)
        yield sse("[DONE]")

    server.gate.script = answer
    async with backend_on(server.url, tokenizer_dir, breaker_failures=1) as backend:
        with pytest.raises(BackendLost, match="aborted") as lost:
            [delta async for delta in backend.submit(make_call(max_tokens=60))]
        assert lost.value.answered  # the server is up: its breaker stays closed
        assert backend.capacity().healthy


async def test_a_call_id_already_running_is_refused(server: Remote, tokenizer_dir: Path) -> None:
    async with backend_on(server.url, tokenizer_dir) as backend:
        stream = backend.submit(make_call("same", max_tokens=4))
        with pytest.raises(ValueError, match="already running"):
            backend.submit(make_call("same"))
        await stream.aclose()


async def test_the_api_key_goes_with_every_request(server: Remote, tokenizer_dir: Path) -> None:
    server.gate.api_key = "sk-secret"
    async with backend_on(server.url, tokenizer_dir, api_key="sk-secret") as backend:
        assert backend.capacity().healthy
        assert [d async for d in backend.submit(make_call())][-1].finished
    with pytest.raises(BackendUnreachable, match="401"):
        async with backend_on(server.url, tokenizer_dir, api_key="sk-wrong"):
            pass


async def test_closing_the_backend_ends_its_running_calls_as_lost(tokenizer_dir: Path) -> None:
    async with remote(SLOW_STEP_S) as server:
        async with backend_on(server.url, tokenizer_dir) as backend:
            stream = backend.submit(make_call(max_tokens=500))
            await anext(aiter(stream))
        with pytest.raises(BackendLost, match="closed"):
            await anext(aiter(stream))
        with anyio.fail_after(5):  # the server saw the disconnect and aborted the call
            await server.engine.wait_idle()
        assert server.engine.num_live == 0


def test_it_takes_only_openai_settings() -> None:
    from gateway.backends import BackendSettings

    with pytest.raises(ValueError, match="kind 'openai'"):
        OpenAIBackend(BackendSettings(), tokenizer=None)


async def test_a_server_that_takes_a_key_serves_the_backend_that_sends_it(
    tokenizer_dir: Path,
) -> None:
    async with remote(api_key="s3cret") as keyed:
        with pytest.raises(BackendUnreachable, match="401"):  # its start-up check is refused
            async with backend_on(keyed.url, tokenizer_dir):
                pass
        async with backend_on(keyed.url, tokenizer_dir, api_key="s3cret") as backend:
            deltas = [delta async for delta in backend.submit(make_call(max_tokens=3))]
        assert deltas[-1].finished and sum(len(d.token_ids) for d in deltas) == 3
