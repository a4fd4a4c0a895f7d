"""Fuzz: thousands of generated jobs and Generate requests through a real gateway.

Hypothesis, derandomized so every run sends the same examples, draws requests from
`strategies` (clean ones at every legal extreme, dirty ones breaking rules) and sends each over
a synchronous channel: a job through SubmitJob (then CancelJob, except for the narrow tenant,
whose jobs are left to queue up against its quota) or RunJob, a GenerateRequest through
Generate, streams read to the end. Invariant: every reply is OK or a proper refusal —
INVALID_ARGUMENT with at least one BadRequest field violation (the caller's fault),
RESOURCE_EXHAUSTED with a QuotaFailure (a quota), or UNAVAILABLE from a server that still
serves, ALREADY_EXISTS, NOT_FOUND — never UNKNOWN, INTERNAL or a timeout; after all of them the
server answers SERVING within a second and still runs an ordinary job.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import grpc
import pytest
from google.protobuf import message
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2
from grpc_status import rpc_status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairgate.v1 import gateway_pb2 as pb
from tests.reliability.conftest import ServedGateway
from tests.reliability.strategies import generate_requests, job_specs

EXAMPLES = 5_000
CALL_TIMEOUT_S = 30.0  # a reply slower than this is a hang, and fails the example
OTHER_REFUSALS = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.NOT_FOUND,
}
Detail = TypeVar("Detail", bound=message.Message)
Call = tuple[str, str, pb.JobSpec | pb.GenerateRequest]  # (rpc, tenant, request)


@st.composite
def calls(draw: st.DrawFn) -> Call:
    """Half SubmitJob, a fifth RunJob, the rest Generate; one in six from the narrow tenant."""
    rpc = draw(st.sampled_from(("submit",) * 5 + ("run",) * 2 + ("generate",) * 3))
    tenant = draw(st.sampled_from(("wide",) * 5 + ("narrow",)))
    return rpc, tenant, draw(generate_requests() if rpc == "generate" else job_specs())


def details(err: grpc.RpcError, kind: type[Detail]) -> list[Detail]:
    status = rpc_status.from_call(err)
    found = []
    for detail in status.details if status is not None else ():
        unpacked = kind()
        if detail.Unpack(unpacked):
            found.append(unpacked)
    return found


def serving(served: ServedGateway) -> bool:
    try:
        reply = served.health.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
    except grpc.RpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def check_refusal(served: ServedGateway, err: grpc.RpcError) -> grpc.StatusCode:
    code: grpc.StatusCode = err.code()
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        bad = details(err, error_details_pb2.BadRequest)
        assert any(b.field_violations for b in bad), f"no field violation: {err}"
    elif code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        assert details(err, error_details_pb2.QuotaFailure), f"no QuotaFailure: {err}"
    else:
        assert code in OTHER_REFUSALS, f"{code.name} is not a proper refusal: {err}"
    # A dead server answers UNAVAILABLE too: that is this call's fault or an earlier one's
    assert code is not grpc.StatusCode.UNAVAILABLE or serving(served), f"server down: {err}"
    return code


def reply_code(served: ServedGateway, call: Callable[[], object]) -> grpc.StatusCode:
    """Run one RPC (a stream read to its end); OK, or the refusal it ended with, checked."""
    try:
        call()
    except grpc.RpcError as err:
        return check_refusal(served, err)
    return grpc.StatusCode.OK


def submit_and_cancel(served: ServedGateway, tenant: str, spec: pb.JobSpec) -> grpc.StatusCode:
    metadata = served.auth(tenant)
    job = pb.Job()

    def submit() -> None:
        request = pb.SubmitJobRequest(job=spec)
        job.CopyFrom(served.stub.SubmitJob(request, metadata=metadata, timeout=CALL_TIMEOUT_S))

    code = reply_code(served, submit)
    if code is grpc.StatusCode.OK and tenant != "narrow":  # narrow's jobs queue: quota refusals
        cancel = pb.CancelJobRequest(job_id=job.job_id)
        reply_code(
            served, lambda: served.stub.CancelJob(cancel, metadata=metadata, timeout=CALL_TIMEOUT_S)
        )
    return code


def send(served: ServedGateway, rpc: str, tenant: str, request: object) -> grpc.StatusCode:
    metadata = served.auth(tenant)
    if isinstance(request, pb.GenerateRequest):
        stream = served.stub.Generate
        return reply_code(
            served, lambda: list(stream(request, metadata=metadata, timeout=CALL_TIMEOUT_S))
        )
    assert isinstance(request, pb.JobSpec)
    if rpc == "submit":
        return submit_and_cancel(served, tenant, request)
    run = pb.SubmitJobRequest(job=request)
    return reply_code(
        served, lambda: list(served.stub.RunJob(run, metadata=metadata, timeout=CALL_TIMEOUT_S))
    )


def run_ordinary_job(served: ServedGateway) -> pb.Job:
    nodes = [
        pb.NodeSpec(id="a", prompt_template="Summarise {{inputs.doc}}"),
        pb.NodeSpec(id="b", prompt_template="Improve: {{a.output}}", depends_on=["a"]),
    ]
    request = pb.SubmitJobRequest(job=pb.JobSpec(nodes=nodes, inputs={"doc": "the quick fox"}))
    events = served.stub.RunJob(request, metadata=served.auth("wide"), timeout=CALL_TIMEOUT_S)
    finished = [e.job_finished.job for e in events if e.WhichOneof("event") == "job_finished"]
    assert len(finished) == 1
    return finished[0]


@pytest.mark.timeout(300)
def test_generated_requests_get_proper_replies_and_the_server_survives(
    served: ServedGateway,
) -> None:
    codes: Counter[grpc.StatusCode] = Counter()

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(calls())
    def one_call(call: Call) -> None:
        codes[send(served, *call)] += 1

    one_call()
    assert codes.total() >= EXAMPLES, codes
    assert codes[grpc.StatusCode.OK] and codes[grpc.StatusCode.INVALID_ARGUMENT], codes
    assert serving(served)
    assert run_ordinary_job(served).state == pb.JOB_STATE_SUCCEEDED
