import pytest

from predictor.cost import CostNode, TokenCounters, job_cost, kv_token_time
from predictor.errors import InvalidCall, JobGraphInvalid


def test_kv_token_time_is_the_sum_over_decode_steps() -> None:
    for p, d in [(0, 0), (5, 1), (10, 7), (100, 33)]:
        assert kv_token_time(p, d) == sum(p + i for i in range(1, d + 1))


def test_kv_token_time_refuses_negative_counts() -> None:
    with pytest.raises(InvalidCall):
        kv_token_time(-1, 3)


def test_token_counters_add_and_weigh_like_vtc() -> None:
    total = TokenCounters(10, 5) + TokenCounters(2, 1)
    assert (total.input_tokens, total.output_tokens, total.total) == (12, 6, 18)
    assert total.vtc_units() == 12 + 2 * 6
    assert total.vtc_units(input_weight=1, output_weight=1) == 18


def test_unrun_children_prompts_include_parents_predicted_outputs() -> None:
    nodes = [
        CostNode("summary", template_tokens=20, output_tokens=40, spliced_parents=("a", "b")),
        CostNode("a", template_tokens=100, output_tokens=50),
        CostNode("b", template_tokens=80, output_tokens=30, prompt_tokens=90, finished=True),
    ]
    cost = job_cost(nodes)
    summary = cost.by_name["summary"]
    assert summary.prompt_tokens == 20 + 50 + 30
    assert summary.kv_token_time == kv_token_time(100, 40)
    assert cost.by_name["b"].prompt_tokens == 90  # a rendered prompt's real length wins
    assert [n.name for n in cost.nodes].index("summary") == 2  # parents first
    assert cost.total == pytest.approx(sum(n.kv_token_time for n in cost.nodes))
    assert cost.remaining == pytest.approx(cost.total - cost.by_name["b"].kv_token_time)


def test_chains_propagate_through_several_levels() -> None:
    nodes = [
        CostNode("c", 5, 7, spliced_parents=("b",)),
        CostNode("b", 5, 6, spliced_parents=("a",)),
        CostNode("a", 5, 4),
    ]
    by_name = job_cost(nodes).by_name
    assert by_name["b"].prompt_tokens == 9
    assert by_name["c"].prompt_tokens == 11


@pytest.mark.parametrize(
    "nodes",
    [
        [CostNode("a", 1, 1, spliced_parents=("missing",))],
        [CostNode("a", 1, 1, spliced_parents=("b",)), CostNode("b", 1, 1, spliced_parents=("a",))],
        [CostNode("a", 1, 1), CostNode("a", 2, 2)],
    ],
)
def test_bad_graphs_are_refused(nodes: list[CostNode]) -> None:
    with pytest.raises(JobGraphInvalid):
        job_cost(nodes)
