"""/v1/models, /health and /metrics, and how engine failures reach clients and health."""

from __future__ import annotations

import openai
import pytest

from engine import SimulatedRunner
from tests.engine.factories import FlakyRunner
from tests.engine.openai_api.conftest import (
    MAX_MODEL_LEN,
    MODEL,
    NUM_BLOCKS,
    Server,
    serving,
    sim_core,
)

pytestmark = pytest.mark.anyio


async def test_models_names_the_served_model_and_its_context(server: Server) -> None:
    models = await server.openai.models.list()
    assert [m.id for m in models.data] == [MODEL]
    response = await server.http.get("/v1/models")
    assert response.json()["data"][0]["max_model_len"] == MAX_MODEL_LEN


@pytest.mark.engine_step_s(0.01)
async def test_metrics_show_a_running_request_and_the_pool(server: Server) -> None:
    samples = {sample.name: sample for sample in await server.samples()}
    info = samples.pop("vllm:cache_config_info")
    assert info.value == 1.0
    assert (info.labels["num_gpu_blocks"], info.labels["block_size"]) == (str(NUM_BLOCKS), "16")
    assert all(sample.labels["model_name"] == MODEL for sample in samples.values())
    before = await server.metrics()
    assert before["vllm:num_requests_running"] == before["vllm:num_requests_waiting"] == 0
    assert before["vllm:kv_cache_usage_perc"] == 0.0
    assert before["fairgate:engine_steps_total"] == 0
    prompt = list(range(1, 41))
    stream = await server.openai.completions.create(
        model=MODEL, prompt=prompt, max_tokens=30, stream=True
    )
    chunks = 0
    async for _ in stream:
        chunks += 1
        if chunks == 1:
            running = await server.metrics()
            assert running["vllm:num_requests_running"] == 1
            assert 0 < running["vllm:kv_cache_usage_perc"] <= 1
            assert running["vllm:prompt_tokens_total"] == len(prompt)
    after = await server.metrics()
    assert after["vllm:generation_tokens_total"] == 30
    assert after["vllm:num_requests_running"] == 0
    # a token a step: the prefill's step made the first
    assert after["fairgate:engine_steps_total"] == server.engine.steps == 30


async def test_failing_steps_are_500s_and_turn_health_503_until_a_step_succeeds() -> None:
    core = sim_core()
    assert isinstance(core.runner, SimulatedRunner)
    core.runner = FlakyRunner(core.runner, fail_on={1, 2, 3})
    async with serving(core) as server:
        assert (await server.http.get("/health")).status_code == 200
        with pytest.raises(openai.InternalServerError, match="engine failed"):
            await server.openai.completions.create(model=MODEL, prompt=[1, 2], max_tokens=3)
        stream = await server.openai.completions.create(
            model=MODEL, prompt=[1, 2], max_tokens=3, stream=True
        )
        with pytest.raises(openai.APIError, match="engine failed"):
            async for _ in stream:
                pass
        response = await server.http.post("/v1/completions", json={"prompt": [1], "max_tokens": 2})
        assert response.status_code == 500
        assert response.json()["error"]["type"] == "InternalServerError"
        assert (await server.http.get("/health")).status_code == 503
        completion = await server.openai.completions.create(model=MODEL, prompt=[1], max_tokens=2)
        assert completion.choices[0].finish_reason == "length"
        assert (await server.http.get("/health")).status_code == 200


async def test_with_an_api_key_only_probes_and_scrapes_go_without_it() -> None:
    """Anyone who reached the port ran the model, at any priority (ahead of a gateway's calls):
    with a key, the routes that run it answer only requests bearing the key, and read no body
    before; /health and /metrics stay open for probes and scrapers."""
    async with serving(sim_core(), api_key="s3cret") as server:
        with pytest.raises(openai.AuthenticationError):  # the SDK sends `Bearer unused`
            await server.openai.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        for path in ("/v1/completions", "/tokenize"):
            refused = await server.http.post(path, content=b"{" * 1000)  # never parsed
            assert refused.status_code == 401
            assert refused.json()["error"]["type"] == "AuthenticationError"
        assert (await server.http.get("/v1/models")).status_code == 401
        wrong = {"Authorization": "Bearer s3cre"}
        assert (await server.http.get("/v1/models", headers=wrong)).status_code == 401
        assert (await server.http.get("/health")).status_code == 200
        assert (await server.http.get("/metrics")).status_code == 200
        keyed = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="s3cret", max_retries=0)
        async with keyed:
            completion = await keyed.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert completion.usage is not None and completion.usage.completion_tokens == 2
