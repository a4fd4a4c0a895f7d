"""The direct client against a fake server in the test's process: the DAG order and the records."""

import json

import anyio
import httpx
import pytest

from bench.backends.direct import run_direct
from bench.backends.workload import PlannedCall, PlannedJob
from bench.workloads.format import Job, Node
from gateway.jobs.model import JobSpec, NodeSpec

pytestmark = pytest.mark.anyio
CALL_S = 0.1  # each fake call takes this long


def sse(tokens: int) -> bytes:
    token = {"index": 0, "text": "x", "token_ids": [7]}
    events: list[dict[str, object]] = [{"choices": [token]} for _ in range(tokens - 1)]
    events.append(
        {"choices": [{"index": 0, "text": "x", "token_ids": [7], "finish_reason": "length"}]}
    )
    events.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": tokens}})
    lines = [f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"]
    return "".join(lines).encode()


class FakeServer:
    def __init__(self) -> None:
        self.spans: dict[str, tuple[float, float]] = {}  # request id -> (received, answered)
        self.bodies: list[dict[str, object]] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        received = anyio.current_time()
        await anyio.sleep(CALL_S)
        self.spans[body["request_id"]] = (received, anyio.current_time())
        events = sse(body["max_tokens"])
        return httpx.Response(200, content=events, headers={"content-type": "text/event-stream"})


def diamond(job_id: str, arrival: float) -> PlannedJob:
    edges = {"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c")}
    calls = tuple(PlannedCall(n, p, n, (1, 2, 3), 2 + i) for i, (n, p) in enumerate(edges.items()))
    nodes = tuple(Node(c.node_id, c.parents, 3, c.max_tokens, c.max_tokens) for c in calls)
    spec = JobSpec(nodes=tuple(NodeSpec(id=c.node_id, prompt_template=c.text) for c in calls))
    return PlannedJob(Job(job_id, "t", 1.0, arrival, "dag", nodes), spec, calls)


async def test_calls_go_as_their_parents_finish_and_no_earlier_than_the_arrival() -> None:
    server = FakeServer()
    jobs = [diamond("j1", 0.0), diamond("j2", 0.1)]
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(server), base_url="http://fake"
    ) as http:
        start = anyio.current_time()
        run = await run_direct(http, "m", jobs, label="t")
    spans = server.spans
    for job in ("j1", "j2"):
        s = {n: spans[f"t-{job}-{n}"] for n in "abcd"}
        assert s["b"][0] >= s["a"][1] and s["c"][0] >= s["a"][1]
        assert s["d"][0] >= max(s["b"][1], s["c"][1])
        assert s["b"][0] < s["c"][1] and s["c"][0] < s["b"][1]  # siblings run together
    assert min(spans[f"t-j2-{n}"][0] for n in "abcd") >= start + 0.1
    assert run.wrong_lengths == 0 and len(run.calls) == 8
    assert set(run.jobs) == {"j1", "j2"}
    assert run.jobs["j2"].arrival == 0.1 and run.jobs["j1"].jct >= 3 * CALL_S
    record = next(c for c in run.calls if (c.job_id, c.node_id) == ("j1", "d"))
    assert record.output_tokens == 5 and record.first_token is not None
    body = next(b for b in server.bodies if b["request_id"] == "t-j1-a")
    assert body["prompt"] == [1, 2, 3] and body["ignore_eos"] is True
    assert body["temperature"] == 0.0 and body["stream_options"] == {"include_usage": True}


async def test_the_probe_stops_once_the_work_is_done() -> None:
    server = FakeServer()
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(server), base_url="http://fake"
    ) as http:
        run = await run_direct(http, "m", [diamond("j", 0.0)], label="p", until_work=1.0)
    assert [c.node_id for c in run.calls] == ["a"] and run.jobs == {}
