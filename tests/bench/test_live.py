"""The live check's parts on a tiny replay: the real gateway and engine, then the simulation."""

from pathlib import Path

import pytest

from bench.live.check import LiveConfig, as_run, depth, settings_for, simulate
from bench.live.model import tiny_model
from bench.live.replay import output_ceiling, replay
from bench.live.steps import fit_step_model
from bench.sim.simulator import EngineSetup
from bench.workloads.format import Job, Node
from engine import EngineConfig, ReserveMode

pytestmark = [pytest.mark.anyio, pytest.mark.integration]  # SmolLM2's tokenizer


def jobs() -> list[Job]:
    chain = tuple(
        Node(f"c{k}", (f"c{k - 1}",) if k else (), 30, 12, 12, think_s=5.0) for k in range(3)
    )
    fan = (
        Node("a", (), 20, 8, 8),
        Node("b", (), 25, 6, 6),
        Node("join", ("a", "b"), 15, 10, 10),
    )
    return [
        Job("chain", "agents", 1.0, 0.0, "agent", chain),
        Job("fan", "docs", 2.0, 0.2, "map_reduce", fan),
        Job("chat", "chat", 1.0, 0.4, "chat", (Node("n", (), 40, 20, 20),)),
    ]


def test_depth_counts_the_calls_on_the_longest_chain() -> None:
    chain, fan, chat = jobs()
    assert (depth(chain), depth(fan), depth(chat)) == (3, 2, 1)


async def test_a_live_replay_runs_each_call_to_its_length_and_feeds_the_simulation(
    tmp_path: Path,
) -> None:
    config = LiveConfig(data=tmp_path, out=tmp_path, scale=1.0)
    model = tiny_model(tmp_path / "model")
    workload = jobs()
    run = await replay(settings_for(config, "justitia", model), workload, 1.0, 64)
    assert output_ceiling(workload, 1.0) <= 64
    assert set(run.jobs) == {"chain", "fan", "chat"}
    for job in workload:
        live = run.jobs[job.job_id]
        assert live.stopped_early == 0
        assert live.output_tokens == {n.node_id: n.output_tokens for n in job.nodes}
        assert all(p > 0 for p in live.prompt_tokens.values())
        assert live.jct > 0
    assert len(run.steps.samples) >= 20  # the chain alone decodes 36 tokens, a step each
    ran = [as_run(job, run, 1.0) for job in workload]
    assert all(n.think_s == 0 for job in ran for n in job.nodes)  # a JobSpec has no think
    assert ran[2].nodes[0].prompt_tokens == run.jobs["chat"].prompt_tokens["n"]
    model_fit, between = fit_step_model([run.steps])
    assert model_fit.overhead_s >= between >= 0
    engine = EngineConfig(
        num_blocks=run.num_blocks, enable_prefix_cache=False, reserve_mode=ReserveMode.PREDICTED
    )
    sim = simulate(ran, "justitia", EngineSetup(engine, model_fit, None))
    assert sim.avg_jct > 0 and 0 <= sim.saturated_step_share <= 1
    assert sim.avg_jct_steps > sim.avg_jct  # a step takes well under a second
