"""A model whose chat template refuses some conversations (Llama 2's and Mistral's raise unless the
roles alternate user/assistant), through the real gRPC API: the tenant is told which node's
messages it refused, as an invalid argument, and other jobs run on."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from fairgate.v1 import gateway_pb2 as pb
from fairgate.v1 import gateway_pb2_grpc
from gateway.server import running_gateway
from gateway.settings import Settings
from tenants import MemoryQuotaStore, TenantQuota
from tests.engine.simulated import sim_core
from tests.gateway.conftest import ADMIN_KEY, Harness, byte_tokenizer

pytestmark = pytest.mark.anyio

ALTERNATING = (
    "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
    "{% endif %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture
async def strict(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """A gateway whose model's chat template raises unless the roles alternate."""
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = ALTERNATING
    store = MemoryQuotaStore()
    await store.create_tenant("alpha", "Alpha", TenantQuota())
    keys = {"alpha": (await store.issue_key("alpha"))[1]}
    settings = Settings(port=0, admin_key=ADMIN_KEY, max_model_len=4096)
    async with (
        running_gateway(settings, core=sim_core(tokenizer=tokenizer), store=store) as gateway,
        grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
    ):
        yield Harness(gateway, channel, gateway_pb2_grpc.GatewayStub(channel), keys)


def _chat(node_id: str, *roles: str) -> pb.NodeSpec:
    messages = [pb.ChatMessage(role=role, content=f"say {k}") for k, role in enumerate(roles)]
    sampling = pb.SamplingSpec(max_tokens=4)
    return pb.NodeSpec(id=node_id, chat=pb.ChatPrompt(messages=messages), sampling=sampling)


async def test_messages_the_chat_template_refuses_are_an_invalid_argument(strict: Harness) -> None:
    """The template's refusal was an unexpected error: INTERNAL ("internal error") for the
    tenant's own messages, with a traceback logged for each such request."""
    job = pb.JobSpec(nodes=[_chat("fine", "user"), _chat("twice", "user", "user")])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await strict.stub.SubmitJob(pb.SubmitJobRequest(job=job), metadata=strict.auth("alpha"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    status = rpc_status.from_call(caught.value)
    assert status is not None
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    (violation,) = bad.field_violations
    assert violation.field == "nodes[1].chat.messages"
    assert "roles must alternate" in violation.description
    good = pb.JobSpec(nodes=[_chat("fine", "user", "assistant", "user")])
    job_id = (
        await strict.stub.SubmitJob(pb.SubmitJobRequest(job=good), metadata=strict.auth("alpha"))
    ).job_id
    assert job_id


async def test_a_generate_the_chat_template_refuses_names_its_messages(strict: Harness) -> None:
    messages = [pb.ChatMessage(role="user", content=text) for text in ("one", "two")]
    request = pb.GenerateRequest(chat=pb.ChatPrompt(messages=messages))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in strict.stub.Generate(request, metadata=strict.auth("alpha")):
            pass
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert "chat.messages: the model's chat template refuses it" in str(caught.value.details())
