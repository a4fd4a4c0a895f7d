"""A job planned as the gateway would send it: its ids and its max_tokens."""

import pytest

from bench.backends.workload import as_run, burst, plan_job
from bench.workloads.format import Job, Node
from gateway.prompts import Prompt


def encode(prompt: Prompt) -> list[int]:
    assert isinstance(prompt, str)
    return [0, *range(1, len(prompt.split()) + 1), 0]  # a "template" token each side


def job() -> Job:
    nodes = (Node("a", (), 400, 100, 200), Node("b", ("a",), 1000, 300, 400))
    return Job("j", "t", 1.0, 2.5, "agent", nodes)


def test_a_call_gets_the_gateways_max_tokens_within_ceiling_and_context() -> None:
    planned = plan_job(job(), scale=0.1, encode=encode, ceiling=25, max_model_len=112)
    a, b = planned.calls
    assert (len(a.prompt_ids), a.max_tokens) == (42, 10)  # ceil(100 * 0.1)
    assert (len(b.prompt_ids), b.max_tokens) == (102, 10)  # 30 asked, 25 allowed, 10 fit
    assert b.parents == ("a",) and planned.output_tokens == 20
    ran = as_run([planned])[0]
    assert [(n.prompt_tokens, n.output_tokens, n.think_s) for n in ran.nodes] == [
        (42, 10, 0.0),
        (102, 10, 0.0),
    ]
    assert burst([planned])[0].job.arrival == 0.0


def test_a_prompt_that_leaves_no_room_is_refused() -> None:
    with pytest.raises(ValueError, match="a prompt of 102 tokens"):
        plan_job(job(), scale=0.1, encode=encode, ceiling=25, max_model_len=102)
