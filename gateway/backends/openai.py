"""The `openai` backend: a vLLM-compatible server over HTTP (vLLM, `fairgate engine serve`).

One shared `httpx.AsyncClient` carries everything. Entering the backend checks the server
(startup.py) and scrapes it once; then a task scrapes `/metrics` every `scrape_interval_s`
and, with a scrape, polls `/health` every `health_interval_s` (every scrape while it fails).
`capacity()` is the last scrape's other clients' part with this gateway's own calls as they are
now (own_calls.py), healthy only while that scrape is fresh, `/health` answered 200 and the circuit
breaker lets calls through. `submit` starts a task per call in the backend's task group: it
streams one `/v1/completions` request (wire.py), decodes its events into deltas (decoder.py),
counts its tokens to its room (what it holds on the server) and hands them to the call's stream
(call_stream.py). Closing that stream early, `abort`, or closing the backend cancels the task,
which closes the HTTP response: the disconnect is the abort the server understands. A failed
connection, a 5xx or a cut stream is `BackendLost` (the call may run elsewhere) and counts
against the breaker, but for a failure the server answered for this call (a 500: errors.py),
which counts neither way; a 4xx is `BackendRefused` (the call fails).
Other replicas send calls to the same server, and room they free shows here only with a scrape:
a call of this replica that ends while the server was full calls `on_freed` (the replicas'
room news, gateway/room_news.py, tells the others), and `scrape_soon` (news from another
replica) has the next scrape start at once. Each landed scrape calls `on_room`, so a call
waiting for room is looked at again as soon as the room shows.
Invariant: every call's task ends by sending its finished delta, an error, or nothing (aborted),
and then frees its room (`OwnCalls.ended`) and its breaker trial, whatever ended it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import math
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream
from httpx_sse import EventSource, ServerSentEvent

from engine import TokenDelta
from gateway.backends.base import BackendCall, BackendCapacity, CallStream, Capabilities
from gateway.backends.breaker import BreakerState, CircuitBreaker
from gateway.backends.call_stream import CallControl, Item, RemoteCallStream
from gateway.backends.decoder import CompletionDecoder
from gateway.backends.errors import BackendError, BackendLost, answer_error
from gateway.backends.own_calls import OwnCalls
from gateway.backends.server_load import ServerLoad, parse_load
from gateway.backends.settings import BackendSettings
from gateway.backends.startup import ServerInfo, check_server
from gateway.backends.wire import completion_body
from gateway.owned import OwnsTasks

logger = logging.getLogger(__name__)

STALE_SCRAPES = 5  # a snapshot older than this many scrape intervals is stale: send nothing
CONNECT_TIMEOUT_S = 5.0
# an idle connection is closed before the server would close it (uvicorn, under vLLM among
# others, does at 5 s): a request sent as the server closes its end fails unread
KEEPALIVE_S = 2.0
NEWS_GAP_S = 0.02  # the least time between two scrapes that news asked for
MAX_ERROR_BYTES = 65_536  # of an error answer read for its message
MAX_METRICS_BYTES = 16 << 20  # a `/metrics` answer longer than this is a failed scrape
MAX_HEALTH_BYTES = 4096  # a `/health` answer longer than this fails the poll (vLLM's is empty)
# what a call's answer may take, in bytes (a constant, each prompt token's id, each output
# token's chunk): a server that sends more, or a line that never ends, loses the call instead
# of filling the gateway's memory. vLLM's chunks are a few hundred bytes a token.
CALL_BYTES = 65_536
CALL_BYTES_PER_PROMPT_TOKEN = 16
CALL_BYTES_PER_TOKEN = 2_048
DRAIN_S = 0.5  # how long the rest of a whole answer is read for (its body's end)


class _Verdict(enum.Enum):
    """What a call's end says about the backend, for the breaker."""

    NONE = "none"  # nothing (aborted before the server answered, or it failed this call)
    WORKS = "works"  # the server answered
    FAILED = "failed"  # no connection, a cut stream, a busy or away answer (errors.py)


@dataclass(slots=True)
class _Attempt:
    """One call's run on the server, as its task sees it."""

    control: CallControl
    send: MemoryObjectSendStream[Item]
    decoder: CompletionDecoder
    trial: bool = False  # the breaker's half-open trial, whose verdict is still due
    shown: bool = False  # its first event came
    verdict: _Verdict = _Verdict.NONE

    async def hand_out(self, deltas: list[TokenDelta]) -> None:
        for delta in deltas:
            if self.decoder.usage is not None:
                self.control.usage = self.decoder.usage  # before the finished delta is seen
            await self.send.send(delta)


class OpenAIBackend(OwnsTasks):
    def __init__(
        self,
        settings: BackendSettings,
        tokenizer: Any,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`tokenizer`: the one loaded from `settings.tokenizer`, which the gateway encodes the
        pool's prompts with (its start-up check asks the server to tokenize alike)."""
        if settings.kind != "openai" or settings.url is None or settings.tokenizer is None:
            raise ValueError("OpenAIBackend needs settings of kind 'openai'")
        super().__init__()
        self.settings = settings
        self.name = settings.display_name
        self.model = settings.model
        self.capabilities = Capabilities(
            hidden_states=False, priority=settings.priority, shared=True
        )
        self.server: ServerInfo | None = None  # what the start-up check read
        self.stale_after_s = STALE_SCRAPES * settings.scrape_interval_s
        self._url = settings.url
        self._tokenizer_dir = settings.tokenizer
        self._tokenizer = tokenizer
        self._clock = clock
        self._breaker = CircuitBreaker(
            clock, settings.breaker_failures, settings.breaker_cooldown_s
        )
        self._own = OwnCalls()
        self._load: ServerLoad | None = None
        self._health_ok = False
        self._health_polled = -math.inf
        self._down_since: float | None = None  # the first scrape since which it has not served
        self._scrape_failure: str | None = None  # the last scrape's failure, logged once
        self._scraped = anyio.Event()
        self._scrape_asked = anyio.Event()
        self._scrape_started = -math.inf
        self.on_room: Callable[[], None] | None = None  # a scrape landed
        self.on_freed: Callable[[OpenAIBackend], None] | None = None  # full, and a call ended
        self._calls: dict[str, CallControl] = {}
        self._client: httpx.AsyncClient | None = None

    # -- lifetime ---------------------------------------------------------------------------

    async def _open(self, stack: contextlib.AsyncExitStack) -> None:
        client = await stack.enter_async_context(self._make_client())
        self.server = await check_server(
            client, self.name, self.model, self._tokenizer_dir, self._tokenizer
        )
        self._client = client
        await self._scrape()  # a first snapshot before anyone asks for room

    def _start_tasks(self, tg: TaskGroup) -> None:
        tg.start_soon(self._scrape_forever)

    def _make_client(self) -> httpx.AsyncClient:
        settings = self.settings
        # bodies as they are: a limit on the bytes of a compressed one bounds nothing (_cap)
        headers = {"Accept-Encoding": "identity"}
        if settings.api_key is not None:
            headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
        verify: ssl.SSLContext | bool = settings.tls_verify
        if settings.tls_ca_file is not None:
            verify = ssl.create_default_context(cafile=str(settings.tls_ca_file))
        # one connection per running call: the server's batch, not the pool, is the limit
        limits = httpx.Limits(
            max_connections=None,
            max_keepalive_connections=settings.max_num_seqs,
            keepalive_expiry=KEEPALIVE_S,
        )
        transport = httpx.AsyncHTTPTransport(
            verify=verify,
            limits=limits,
            # a request's headers and body leave in two writes: with Nagle's algorithm the body
            # waits for the server's delayed ACK of the headers, 40 ms on Linux, on every call
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        )
        return httpx.AsyncClient(
            base_url=self._url,
            headers=headers,
            transport=transport,
            # streams may idle while the server queues or prefills; connecting may not
            timeout=httpx.Timeout(settings.read_timeout_s, connect=CONNECT_TIMEOUT_S),
            # the server's address is explicit: proxies meant for the outside world stay out
            trust_env=False,
        )

    @property
    def client(self) -> httpx.AsyncClient:
        assert self._client is not None, "not entered"
        return self._client

    # -- room -------------------------------------------------------------------------------

    def capacity(self) -> BackendCapacity:
        load = self._load
        if load is None:
            return BackendCapacity(0, 1, 0, running=0, waiting=len(self._own), healthy=False)
        healthy = self._serving(load)
        room = self._own.capacity(load, self.settings.max_num_seqs, healthy)
        if healthy and self._breaker.state is BreakerState.HALF_OPEN:
            # room for the trial alone: a dispatch pass takes calls before it sends any, and
            # would take as many as the server had room for, all sent before the verdict
            room = dataclasses.replace(room, free_slots=min(room.free_slots, 1))
        return room

    def _serving(self, load: ServerLoad | None) -> bool:
        fresh = load is not None and self._clock() - load.taken_at <= self.stale_after_s
        return fresh and self._health_ok and self._breaker.allows()

    def down_for(self) -> float | None:
        """How long it has not served, as its scrapes saw it (None: it serves)."""
        return None if self._down_since is None else self._clock() - self._down_since

    @property
    def load(self) -> ServerLoad | None:
        """The last scrape as the server reported it."""
        return self._load

    async def next_scrape(self) -> None:
        """Wait until the next scrape has landed (or failed)."""
        await self._scraped.wait()

    def scrape_soon(self) -> None:
        """Start the next scrape now (another replica freed room on the server)."""
        self._scrape_asked.set()

    async def _scrape_forever(self) -> None:
        while True:
            with anyio.move_on_after(self.settings.scrape_interval_s):
                await self._scrape_asked.wait()
                # however much news comes, the server is scraped at most every NEWS_GAP_S
                await anyio.sleep(max(self._scrape_started + NEWS_GAP_S - self._clock(), 0.0))
            self._scrape_asked = anyio.Event()
            await self._scrape()

    async def _scrape(self) -> None:
        mark = self._own.scrape_started()
        taken_at = self._scrape_started = self._clock()
        timeout = max(self.stale_after_s, 1.0)
        failure = None
        try:
            load = parse_load(await self._read_metrics(timeout), self.model, taken_at)
        except Exception as exc:  # whatever the server sent fails this scrape, not the backend
            failure = f"/metrics: {exc!r}"
        else:
            self._load = load
            self._own.scraped(mark)
            if self.on_room is not None:
                self.on_room()
        if not self._health_ok or taken_at - self._health_polled >= self.settings.health_interval_s:
            self._health_polled = taken_at
            unhealthy = await self._poll_health(timeout)
            self._health_ok = unhealthy is None
            failure = failure or unhealthy
        if self._serving(self._load):
            self._down_since = None
        elif self._down_since is None:
            self._down_since = taken_at
        if failure != self._scrape_failure:
            if failure is not None:
                logger.warning("backend %s: %s", self.name, failure)
            else:
                logger.info("backend %s: scraped again", self.name)
            self._scrape_failure = failure
        self._scraped.set()
        self._scraped = anyio.Event()

    async def _read_metrics(self, timeout: float) -> str:
        """The `/metrics` text (`_get`)."""
        response = await self._get("/metrics", MAX_METRICS_BYTES, timeout)
        response.raise_for_status()
        return response.content.decode(response.encoding or "utf-8", "replace")

    async def _poll_health(self, timeout: float) -> str | None:
        """Why `/health` says the server is not healthy; None when it answered 200. Its answer
        is read to its end (`_get`), so that the connection is kept."""
        try:
            response = await self._get("/health", MAX_HEALTH_BYTES, timeout)
        except (httpx.HTTPError, BackendLost, TimeoutError) as exc:
            return f"/health: {exc!r}"
        if response.status_code != 200:
            return f"/health answered {response.status_code}"
        return None

    async def _get(self, path: str, limit: int, timeout: float) -> httpx.Response:
        """GET `path`, its answer read whole within `limit` bytes and `timeout` in all: the
        client's timeout bounds each read, and a server that sends a line now and then would
        hold this scrape, and every later one, for as long as it likes (its snapshot stale,
        yet never found down)."""
        with anyio.fail_after(timeout):
            async with self.client.stream("GET", path, timeout=timeout) as response:
                _cap(response, limit, path)
                await response.aread()
        return response

    # -- calls ------------------------------------------------------------------------------

    def submit(self, call: BackendCall) -> CallStream:
        """Start the call; ValueError for a call id already running here."""
        tasks = self.tasks  # not entered, or closed: nothing is booked
        if call.call_id in self._calls:
            raise ValueError(f"backend {self.name}: call {call.call_id} is already running")
        output = call.predicted_output or call.params.max_tokens
        self._own.sent(call.call_id, len(call.prompt_ids), output)
        control = CallControl(call.call_id)
        self._calls[call.call_id] = control
        send, receive = anyio.create_memory_object_stream[Item](math.inf)
        decoder = CompletionDecoder(call.call_id, len(call.prompt_ids), call.params.max_tokens)
        attempt = _Attempt(control, send, decoder)
        attempt.trial = self._breaker.started()
        tasks.start_soon(self._run, call, attempt)
        return RemoteCallStream(control, receive)

    def abort(self, call_id: str) -> None:
        control = self._calls.get(call_id)
        if control is not None:
            control.abort()

    def set_priority(self, call_id: str, priority: float) -> None:
        """Nothing: a vLLM-compatible server takes a request's priority once, when it comes."""

    def set_prediction(self, call_id: str, predicted_output: int) -> None:
        self._own.resized(call_id, predicted_output)

    async def _run(self, call: BackendCall, attempt: _Attempt) -> None:
        control = attempt.control
        try:
            with attempt.send, control.scope:
                try:
                    await self._stream(call, attempt)
                    attempt.verdict = _Verdict.WORKS
                except anyio.BrokenResourceError:
                    pass  # the stream was closed: nobody listens, the response closes here
                except Exception as exc:  # whatever the server did, it ends this call only
                    error = self._as_backend_error(call, exc)
                    attempt.verdict = _verdict(error)
                    # its reader may be gone (it had the finished delta): nobody to tell
                    with contextlib.suppress(anyio.BrokenResourceError):
                        await attempt.send.send(error)
        finally:
            if control.usage is None:
                control.usage = attempt.decoder.counted_usage()
            # the room this call frees is news only if the server had none before its end
            news = self.on_freed if self.on_freed is not None and self._full_for(call) else None
            self._own.ended(call.call_id)
            del self._calls[call.call_id]
            control.ended.set()
            if attempt.verdict is _Verdict.WORKS:
                self._breaker.succeeded()
            elif attempt.verdict is _Verdict.FAILED:
                self._breaker.failed(attempt.trial)
            else:
                self._breaker.abandoned(attempt.trial)
            if news is not None:
                news(self)

    def _full_for(self, call: BackendCall) -> bool:
        """Whether the server had no room for another call like `call` (its room is news)."""
        room = self.capacity()
        worst = room.blocks_for(len(call.prompt_ids) + call.params.max_tokens)
        return room.free_slots == 0 or room.free_blocks < worst

    async def _stream(self, call: BackendCall, attempt: _Attempt) -> None:
        """Stream the call's deltas to its stream; raises what ends it otherwise."""
        body = completion_body(call, self.model, self.settings.priority)
        async with self.client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                raise _refusal(call, response.status_code, await _head(response))
            _cap(response, _call_bytes(call), f"call {call.call_id}'s answer")
            events = EventSource(response).aiter_sse()
            async with contextlib.aclosing(events):
                await self._read_events(call, attempt, events)
                await attempt.hand_out(attempt.decoder.end())
                # the answer is whole: the body's end (at once, from a server that keeps to
                # the protocol) is read a moment so that the connection serves the next call;
                # one left open, or more sent, neither holds the call's room nor counts
                with anyio.move_on_after(DRAIN_S), contextlib.suppress(Exception):
                    async for _ in events:
                        pass

    async def _read_events(
        self, call: BackendCall, attempt: _Attempt, events: AsyncIterator[ServerSentEvent]
    ) -> None:
        """Read the answer's events up to `[DONE]`; BackendLost when `read_timeout_s` passes with
        no token: the read timeout alone never fires while a hung server sends keep-alive
        comments or empty chunks, and the call would hold its room for ever."""
        silence = self.settings.read_timeout_s
        decoder = attempt.decoder
        with anyio.CancelScope(deadline=anyio.current_time() + silence) as quiet:
            async for event in events:
                counted = decoder.counted
                deltas = decoder.feed(event.data)
                self._own.streamed(call.call_id, decoder.counted)  # the KV it holds there
                await attempt.hand_out(deltas)
                if not attempt.shown:
                    self._shown(attempt)
                if decoder.done:
                    return
                if decoder.counted > counted:
                    quiet.deadline = anyio.current_time() + silence
        if quiet.cancelled_caught:
            raise BackendLost(f"call {call.call_id}: no token for {silence:g} s")

    def _shown(self, attempt: _Attempt) -> None:
        """The server streamed the call's first event: the half-open breaker's trial has its
        verdict (it closes the breaker), so the next calls need not wait for its whole answer.
        Any other call's verdict waits for its end: taken at the first event, a server that
        failed every call once it had streamed reset the count of failures each time, and the
        breaker never opened."""
        attempt.shown = True
        if attempt.trial:
            self._breaker.succeeded()
            attempt.trial = False

    def _as_backend_error(self, call: BackendCall, exc: Exception) -> BackendError:
        if isinstance(exc, BackendError):
            return exc
        if not isinstance(exc, httpx.HTTPError):  # not the network's: a fault to look into
            logger.error("backend %s: call %s", self.name, call.call_id, exc_info=exc)
        return BackendLost(f"backend {self.name}: call {call.call_id}: {exc!r}")


def _verdict(error: BackendError) -> _Verdict:
    if not isinstance(error, BackendLost):
        return _Verdict.WORKS  # a refusal is an answer: the server works
    # a server that failed this call and said so is up; the call may be what fails it, and one
    # tenant's calls must not open the breaker for every tenant (/health says if it is sick)
    return _Verdict.NONE if error.answered else _Verdict.FAILED


def _call_bytes(call: BackendCall) -> int:
    """The most a call's answer may take (`CALL_BYTES`)."""
    prompt = CALL_BYTES_PER_PROMPT_TOKEN * len(call.prompt_ids)
    return CALL_BYTES + prompt + CALL_BYTES_PER_TOKEN * call.params.max_tokens


def _cap(response: httpx.Response, limit: int, what: str) -> None:
    """Reading more than `limit` bytes of the response's body raises BackendLost. So does a
    compressed body (the client asks for none): the limit bounds the bytes that come, and
    16 MiB of gzip decode to 16 GiB."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise BackendLost(f"{what} came compressed ({encoding}), which was not asked for")
    response.stream = _Capped(response.stream, limit, what)


class _Capped(httpx.AsyncByteStream):
    def __init__(
        self, stream: httpx.SyncByteStream | httpx.AsyncByteStream, limit: int, what: str
    ) -> None:
        assert isinstance(stream, httpx.AsyncByteStream), "an async client's response"
        self._stream, self._limit, self._what = stream, limit, what

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        async for part in self._stream:
            read += len(part)
            if read > self._limit:
                raise BackendLost(f"{self._what} is longer than {self._limit} bytes")
            yield part

    async def aclose(self) -> None:
        await self._stream.aclose()


async def _head(response: httpx.Response) -> bytes:
    """The start of an error answer's body: what says why, never all a server may send."""
    head = b""
    async for part in response.aiter_bytes():
        head += part
        if len(head) >= MAX_ERROR_BYTES:
            break
    return head[:MAX_ERROR_BYTES]


def _refusal(call: BackendCall, status: int, body: bytes) -> BackendError:
    """The error a non-200 answer to a completion request stands for."""
    try:
        message = str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = body[:300].decode("utf-8", "replace")
    text = f"call {call.call_id}: the server answered {status}: {message[:300]}"
    return answer_error(text, status)
