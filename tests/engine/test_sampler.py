"""The sampler: greedy, filters, seeded reproducibility and the shape of its distributions."""

from __future__ import annotations

import math

import pytest
import torch

from engine.errors import InvalidRequest
from engine.sampler import NUCLEUS_CANDIDATES, Sampler, _filtered_probs
from engine.sampling import MAX_TEMPERATURE, MIN_TEMPERATURE, SamplingParams

GREEDY = SamplingParams()


def random_logits(rows: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def probs_logits(probs: list[float]) -> torch.Tensor:
    return torch.tensor([[math.log(p) for p in probs]])


def draw_many(params: SamplingParams, logits: torch.Tensor, n: int) -> list[int]:
    """n draws of one row, each a different output index of a seeded request."""
    sampler = Sampler()
    return [sampler(logits, [params], [i])[0] for i in range(n)]


def test_greedy_takes_the_argmax_of_every_row() -> None:
    logits = random_logits(6)
    assert Sampler(seed=0)(logits, [GREEDY] * 6, [0] * 6) == logits.argmax(-1).tolist()


def test_greedy_rows_stay_greedy_beside_sampled_rows() -> None:
    logits = random_logits(4)
    params = [
        GREEDY,
        SamplingParams(temperature=1.0, seed=1),
        GREEDY,
        SamplingParams(temperature=2),
    ]
    got = Sampler(seed=0)(logits, params, [0] * 4)
    argmax = logits.argmax(-1).tolist()
    assert (got[0], got[2]) == (argmax[0], argmax[2])


def test_top_k_one_equals_greedy() -> None:
    logits = random_logits(8, seed=3)
    params = [SamplingParams(temperature=1.5, top_k=1)] * 8
    assert Sampler(seed=0)(logits, params, list(range(8))) == logits.argmax(-1).tolist()


def test_seeded_draw_depends_only_on_seed_index_and_logits() -> None:
    logits = random_logits(5, seed=4)
    seeded = SamplingParams(temperature=1.0, seed=42)
    alone = [Sampler()(logits[2:3], [seeded], [i])[0] for i in range(20)]
    others = [
        SamplingParams(temperature=0.7),
        GREEDY,
        seeded,
        SamplingParams(temperature=1, seed=7),
    ]
    in_batch = []
    for i in range(20):
        params = [
            others[0],
            others[1],
            seeded,
            others[3],
            SamplingParams(temperature=1.3, top_p=0.9),
        ]
        in_batch.append(Sampler()(logits, params, [3, 9, i, 1, 0])[2])
    assert in_batch == alone
    assert len(set(alone)) > 1  # the output index moves the draw


def test_top_p_keeps_the_smallest_set_reaching_p_and_renormalises() -> None:
    logits = probs_logits([0.5, 0.3, 0.15, 0.05])
    draws = draw_many(SamplingParams(temperature=1.0, top_p=0.7, seed=0), logits, 4000)
    assert set(draws) <= {0, 1}
    share = draws.count(0) / len(draws)
    assert abs(share - 0.5 / 0.8) < 0.03  # 4 standard deviations of a binomial share


def test_top_p_never_empties_the_set() -> None:
    logits = probs_logits([0.9, 0.05, 0.05])
    assert set(draw_many(SamplingParams(temperature=1.0, top_p=0.01, seed=0), logits, 200)) == {0}
    # a top_p that float32 rounds to 0 kept nothing, and the draw fell on the last token id
    assert set(draw_many(SamplingParams(temperature=1.0, top_p=1e-50, seed=0), logits, 50)) == {0}


def test_top_k_restricts_to_the_k_most_likely() -> None:
    logits = probs_logits([0.1, 0.4, 0.2, 0.3])
    draws = draw_many(SamplingParams(temperature=1.0, top_k=2, seed=0), logits, 2000)
    assert set(draws) == {1, 3}
    assert abs(draws.count(1) / len(draws) - 0.4 / 0.7) < 0.045


def test_temperature_one_follows_the_softmax() -> None:
    probs = [0.4, 0.3, 0.2, 0.1]
    draws = draw_many(SamplingParams(temperature=1.0, seed=5), probs_logits(probs), 5000)
    for token, p in enumerate(probs):
        sd = math.sqrt(p * (1 - p) / len(draws))
        assert abs(draws.count(token) / len(draws) - p) < 4 * sd


def test_low_temperature_concentrates_on_the_argmax() -> None:
    logits = probs_logits([0.3, 0.4, 0.3])  # at T = 0.05 the middle token has odds e^5.75 : 2
    draws = draw_many(SamplingParams(temperature=0.05, seed=0), logits, 300)
    assert draws.count(1) >= 290


def test_unseeded_sampler_seed_reproduces_its_stream() -> None:
    logits = random_logits(3, seed=6)
    params = [SamplingParams(temperature=1.0)] * 3
    first, second = Sampler(seed=11), Sampler(seed=11)
    assert [first(logits, params, [0] * 3) for _ in range(5)] == [
        second(logits, params, [0] * 3) for _ in range(5)
    ]


def nucleus_by_full_sort(probs: torch.Tensor, top_p: float) -> set[int]:
    """The oracle: walk the whole row in descending order until the mass reaches top_p."""
    kept, mass = set(), 0.0
    for p, token in sorted(zip(probs.tolist(), range(len(probs)), strict=True), reverse=True):
        if mass >= top_p:
            break
        kept.add(token)
        mass += p
    return kept


def test_top_p_set_equals_a_full_sort_whether_or_not_it_fits_the_candidates() -> None:
    vocab = 4 * NUCLEUS_CANDIDATES
    peaked = random_logits(3, vocab, seed=8) * 3  # nuclei of a few tokens
    flat = random_logits(3, vocab, seed=9) * 0.05  # nuclei of most of the vocabulary
    logits = torch.cat([peaked[:1], flat[:1], peaked[1:], flat[1:]]).double()
    probs = torch.softmax(logits, dim=-1)
    filtered = _filtered_probs(logits, [SamplingParams(temperature=1.0, top_p=0.9)] * 6)
    sizes = []
    for row in range(6):
        want = nucleus_by_full_sort(probs[row], 0.9)
        assert set(filtered[row].nonzero()[:, 0].tolist()) == want
        sizes.append(len(want))
    assert min(sizes) < NUCLEUS_CANDIDATES < max(sizes)  # both paths ran


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": 1e-40},
        {"temperature": MIN_TEMPERATURE / 2},
        {"temperature": -0.5},
        {"temperature": MAX_TEMPERATURE * 1.01},
        {"temperature": math.nan},
        {"temperature": math.inf},
        {"top_p": math.nan},
        {"top_p": math.inf},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"max_tokens": 0},
        {"min_tokens": -1},
        {"max_tokens": 4, "min_tokens": 5},
        {"stop_token_ids": (3, -1)},
        {"top_k": -1},
        {"seed": -1},
        {"seed": 2**64},
    ],
)
def test_params_that_could_break_the_arithmetic_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(InvalidRequest):
        SamplingParams(**bad)  # type: ignore[arg-type]


def test_the_edges_of_every_range_are_accepted() -> None:
    for temperature in (0.0, MIN_TEMPERATURE, MAX_TEMPERATURE):
        SamplingParams(temperature=temperature)
    SamplingParams(max_tokens=1, top_p=1e-9, top_k=0, seed=0)
    SamplingParams(seed=2**64 - 1)


def test_min_temperature_on_random_logits_draws_valid_tokens() -> None:
    vocab = 32000
    logits = random_logits(8, vocab, seed=10) * 10
    params = [
        SamplingParams(temperature=MIN_TEMPERATURE),
        SamplingParams(temperature=MIN_TEMPERATURE, seed=3),
        SamplingParams(temperature=MIN_TEMPERATURE, top_p=0.5),
        SamplingParams(temperature=MIN_TEMPERATURE, top_k=40),
    ] * 2
    probs = _filtered_probs(logits.float(), params)
    assert bool(probs.isfinite().all()) and torch.allclose(probs.sum(-1), torch.ones(8))
    tokens = Sampler(seed=0)(logits, params, list(range(8)))
    assert all(0 <= t < vocab for t in tokens)
    assert tokens == logits.argmax(-1).tolist()  # at T = 0.01 the gaps dwarf the noise


def test_logits_near_the_float32_limit_stay_finite_at_min_temperature() -> None:
    big = torch.finfo(torch.float32).max / 4  # divided by 0.01 without the shift: inf
    logits = torch.tensor([[big, big / 2, -big, 0.0], [0.0, big, big, -big]])
    params = [SamplingParams(temperature=MIN_TEMPERATURE, seed=1)] * 2
    probs = _filtered_probs(logits, params)
    assert bool(probs.isfinite().all())
    assert probs[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    first, second = Sampler()(logits, params, [0, 0])
    assert first == 0 and second in {1, 2}


def test_min_tokens_rules_out_eos_and_stop_ids_until_it_is_reached() -> None:
    logits = torch.full((3, 6), -5.0)
    logits[:, 2] = 9.0  # EOS is every row's favourite
    logits[:, 4] = 5.0  # a request's stop token id comes next
    logits[:, 1] = 1.0
    short = SamplingParams(max_tokens=8, min_tokens=3, stop_token_ids=(4,))
    sampler = Sampler(eos_token_ids=frozenset({2}))
    assert sampler(logits.clone(), [short] * 3, [0, 2, 3]) == [1, 1, 2]
    ignoring = SamplingParams(max_tokens=8, min_tokens=3, ignore_eos=True)
    assert sampler(logits[:1].clone(), [ignoring], [0]) == [2]  # EOS ends nothing: left in
    hot = SamplingParams(max_tokens=8, min_tokens=3, temperature=5.0)
    drawn = {sampler(logits[:1].clone(), [hot], [0])[0] for _ in range(200)}
    assert 2 not in drawn and len(drawn) > 1
