"""A hostile tenant's jobs through the real gRPC API: what one request costs the event loop,
which every tenant's RPCs and streams share, stays bounded within the default limits."""

from __future__ import annotations

import time

import anyio
import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from bench.loop_watch import LoopWatch
from fairgate.v1 import gateway_pb2 as pb
from gateway.jobs import FieldViolation, validation
from tests.gateway.conftest import Harness

pytestmark = pytest.mark.anyio


async def test_a_large_prompt_is_encoded_with_the_event_loop_free(harness: Harness) -> None:
    """The tokenizer's `encode` holds the GIL while it runs: a worker thread encoding a prompt
    at the default bound (262,144 characters) held the loop for all of it, hundreds of ms."""
    prompt = pb.NodeSpec(id="big", prompt_template="{{inputs.doc}}{{inputs.doc}}")
    spec = pb.JobSpec(nodes=[prompt], inputs={"doc": "\N{GRINNING FACE}" * 131_072})
    watch = LoopWatch()
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.watch)
        started = time.perf_counter()
        events = harness.stub.RunJob(pb.SubmitJobRequest(job=spec), metadata=harness.auth("alpha"))
        ended = [e.job_finished.job async for e in events if e.HasField("job_finished")]
        took = time.perf_counter() - started
        watch.watching = False
    (node,) = ended[0].nodes
    assert node.state == pb.NODE_STATE_FAILED and "tokens exceeds" in node.reason  # encoded
    assert watch.longest < took / 4, f"the loop was held {watch.longest:.3f} s of {took:.3f} s"


async def test_a_job_breaking_a_rule_per_edge_is_refused_after_the_violations_shown(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """256 nodes that list 256 unknown dependencies each break 65,536 rules: every one was
    spelt out on the event loop (a good part of a second) before all but the first ~60, which
    fit the trailer, were dropped."""
    made: list[str] = []

    def noted(field: str, description: str) -> FieldViolation:
        made.append(field)
        return FieldViolation(field, description)

    monkeypatch.setattr(validation, "FieldViolation", noted)
    ghosts = [f"ghost_{k}" for k in range(256)]
    nodes = [pb.NodeSpec(id=f"n{i}", prompt_template="hi", depends_on=ghosts) for i in range(256)]
    request = pb.SubmitJobRequest(job=pb.JobSpec(nodes=nodes))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await harness.stub.SubmitJob(request, metadata=harness.auth("alpha"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(caught.value)
    assert status is not None
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    shown = bad.field_violations
    assert shown[0].description == "unknown node 'ghost_0'"
    assert shown[-1].description == "more not shown"
    # the one past the budget, drawn to know that there are more, is made too
    assert len(made) <= len(shown) + 1, f"{len(made)} violations made to show {len(shown)}"
