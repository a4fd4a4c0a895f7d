"""A job's trace as a real tracing backend keeps it: Arize Phoenix (phoenix_server.py here).

The gateway exports over OTLP/gRPC as an operator sets it up (`OTEL_EXPORTER_OTLP_ENDPOINT`), runs
a map-reduce job whose third map fails in the engine after 8 of its 64 tokens, and the spans
are read back from Phoenix's REST API: the gRPC server span, the job's `invoke_workflow` span
under it, one `chat` span per node that ran under that (not the reduce, failed with its parent),
with the served model's id, the GenAI attributes, fairgate's events, and the errors.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider

from engine import SimulatedRunner
from engine.plan import StepOutput, StepPlan
from fairgate.v1 import gateway_pb2 as pb
from gateway.telemetry import PROVIDER_NAME, setup_tracing
from tests.gateway.conftest import sim_core
from tests.integration.phoenix_server import INSTALL_S, START_TIMEOUT_S, PhoenixServer
from tests.reliability.harness import node, reliable_gateway

# the first test to ask for the server may install Phoenix too
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(INSTALL_S + START_TIMEOUT_S + 120)]

JOB_NAME = "map-reduce"
READ_BACK_S = 15.0  # Phoenix stores what it receives in batches


class FailsAlone:
    """A simulated runner whose step fails once, when it would advance one node's call alone
    after that call has made `after` tokens: the node fails in the engine, no other call does."""

    def __init__(self, runner: SimulatedRunner, node_id: str, after: int) -> None:
        self.runner = runner
        self.eos_token_ids = runner.eos_token_ids
        self.hidden_size = runner.hidden_size
        self.vocab_size = runner.vocab_size
        self.suffix, self.after = f"/{node_id}", after
        self.failed = False

    def execute(self, plan: StepPlan) -> StepOutput:
        seqs = plan.seqs
        alone = len(seqs) == 1 and seqs[0].request_id.endswith(self.suffix)
        if alone and seqs[0].num_output_tokens >= self.after and not self.failed:
            self.failed = True
            raise RuntimeError("the runner failed")
        return self.runner.execute(plan)


def map_reduce() -> pb.JobSpec:
    maps = [node("map0", "summarize part 0", 4), node("map1", "summarize part 1", 4)]
    maps.append(node("map2", "summarize part 2", 64))  # still running once the others are done
    inputs = " ".join(f"{{{{map{i}.output}}}}" for i in range(3))
    reduce = node("reduce", f"combine: {inputs}", 8, "map0", "map1", "map2")
    return pb.JobSpec(name=JOB_NAME, nodes=[*maps, reduce])


async def read_trace(phoenix: PhoenixServer, job_id: str, count: int) -> list[dict[str, Any]]:
    """The spans of the job's trace, once Phoenix holds `count` of them (a bounded wait)."""
    with anyio.fail_after(READ_BACK_S):
        while True:
            spans = await phoenix.spans()
            jobs = [s for s in spans if s["attributes"].get("fairgate.job.id") == job_id]
            trace_ids = {s["context"]["trace_id"] for s in jobs}
            mine = [s for s in spans if s["context"]["trace_id"] in trace_ids]
            if len(mine) >= count:
                return mine
            await anyio.sleep(0.2)


async def test_a_failed_map_reduce_job_reaches_phoenix_as_one_tree(
    phoenix_server: PhoenixServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix_server.otlp_endpoint)
    provider = setup_tracing()
    assert isinstance(provider, TracerProvider)
    core = sim_core(0.002)
    core.runner = FailsAlone(core.runner, "map2", after=8)  # type: ignore[arg-type]
    try:
        async with reliable_gateway(core=core, tracer_provider=provider) as h:
            await h.tenant("acme")
            job = await h.run("acme", map_reduce())
            model = h.gateway.dispatcher.default_model
            await h.unharmed()
        assert provider.force_flush()
        # server span, job span, three chat spans
        spans = await read_trace(phoenix_server, job.job_id, 5)
    finally:
        provider.shutdown()

    assert job.state == pb.JOB_STATE_FAILED
    states = {n.id: (n.state, n.reason) for n in job.nodes}
    assert states["map2"] == (pb.NODE_STATE_FAILED, "engine error")
    assert states["reduce"] == (pb.NODE_STATE_FAILED, "parent 'map2' failed")

    [workflow] = [s for s in spans if s["name"] == f"invoke_workflow {JOB_NAME}"]
    [server] = [s for s in spans if s["context"]["span_id"] == workflow["parent_id"]]
    assert server["name"].endswith("/SubmitJob") and server["parent_id"] is None
    attrs = workflow["attributes"]
    assert attrs["gen_ai.operation.name"] == "invoke_workflow"
    assert attrs["gen_ai.workflow.name"] == JOB_NAME
    assert attrs["fairgate.job.state"] == "failed" and attrs["error.type"] == "engine_error"
    assert workflow["status_code"] == "ERROR"
    assert workflow["status_message"] == "node 'map2': engine error"
    [unrun] = [e for e in workflow["events"] if e["name"] == "fairgate.node.failed"]
    assert unrun["attributes"]["fairgate.node.id"] == "reduce"
    assert unrun["attributes"]["error.type"] == "parent_failed"

    chats = {s["attributes"]["fairgate.node.id"]: s for s in spans if s["name"].startswith("chat")}
    assert sorted(chats) == ["map0", "map1", "map2"]  # the nodes that ran
    for node_id, chat in chats.items():
        attrs = chat["attributes"]
        assert (
            chat["name"] == f"chat {model}" and chat["parent_id"] == workflow["context"]["span_id"]
        )
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == PROVIDER_NAME
        assert attrs["gen_ai.request.model"] == attrs["gen_ai.response.model"] == model
        assert attrs["gen_ai.request.stream"] is True
        assert attrs["gen_ai.response.time_to_first_chunk"] >= 0
        assert attrs["fairgate.backend.name"] == "local" and "server.address" not in attrs
        assert attrs["fairgate.queue.wait_s"] >= 0
        events = [e["name"] for e in chat["events"]]
        assert events == ["fairgate.queued", "fairgate.prediction", "fairgate.dispatched"]
        dispatched = chat["events"][-1]["attributes"]
        assert dispatched["fairgate.backend.name"] == "local", node_id
    for node_id in ("map0", "map1"):
        attrs = chats[node_id]["attributes"]
        assert chats[node_id]["status_code"] != "ERROR" and "error.type" not in attrs
        assert attrs["gen_ai.usage.output_tokens"] == 4
        assert attrs["gen_ai.response.finish_reasons"] == ["length"]
    failed = chats["map2"]
    assert failed["status_code"] == "ERROR" and failed["status_message"] == "engine error"
    assert failed["attributes"]["error.type"] == "engine_error"
    assert failed["attributes"]["gen_ai.response.finish_reasons"] == ["error"]
    assert failed["attributes"]["fairgate.node.state"] == "failed"
