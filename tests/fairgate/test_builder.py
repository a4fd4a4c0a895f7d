"""Job builders and JSON: what they build passes the gateway's own validation."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from fairgate import (
    JobBuilder,
    JobSpecInvalid,
    job_from_json,
    job_to_json,
    map_reduce,
    parallel_sample,
)
from gateway.gateway_protos import job_spec_from_proto
from gateway.jobs import references, validate_job

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def test_job_builder_builds_a_valid_dag() -> None:
    spec = (
        JobBuilder("summarise", idempotency_key="k-1", priority=3)
        .input("doc1", "Some text.")
        .node("map_1", prompt="Summarise: {{inputs.doc1}}", max_tokens=64, seed=7)
        .node(
            "reduce",
            chat=[("system", "Be brief."), ("user", "Combine: {{map_1.output}}")],
            depends_on=["map_1"],
            stop=["\n\n"],
        )
        .build()
    )
    job = job_spec_from_proto(spec)
    validate_job(job)
    assert (job.name, job.idempotency_key, job.priority) == ("summarise", "k-1", 3)
    map_1, reduce = job.nodes
    assert (map_1.sampling.max_tokens, map_1.sampling.seed) == (64, 7)
    assert map_1.sampling.temperature is None  # unset stays unset: the server decides
    assert reduce.depends_on == ("map_1",)
    assert reduce.messages is not None and reduce.messages[1].role == "user"
    assert reduce.sampling.stop == ("\n\n",)


def test_job_builder_keeps_an_aware_deadline() -> None:
    deadline = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    spec = JobBuilder(deadline=deadline).node("a", prompt="hi").build()
    assert job_spec_from_proto(spec).deadline_unix_s == deadline.timestamp()


@pytest.mark.parametrize(
    "misuse",
    [
        lambda: JobBuilder().node("a", prompt="x", chat=[("user", "y")]),
        lambda: JobBuilder().node("a"),
        lambda: JobBuilder().node("a", prompt="x").node("a", prompt="y"),
        lambda: JobBuilder(deadline=datetime(2030, 1, 1)),  # naive: refused
        lambda: map_reduce({}),
        lambda: parallel_sample("q", 0),
        lambda: parallel_sample("q", 3, seeds=[1, 2]),
        lambda: job_from_json('{"nodes": [{"id": "a", "promptTemplat": "typo"}]}'),
    ],
)
def test_builders_refuse_what_cannot_be_a_job(misuse: object) -> None:
    with pytest.raises(JobSpecInvalid):
        misuse()  # type: ignore[operator]


def test_map_reduce_reduce_reads_every_map_output() -> None:
    documents = {f"doc{i}": f"text {i}" for i in range(10)}
    job = job_spec_from_proto(map_reduce(documents, max_tokens=32))
    validate_job(job)
    *maps, reduce = job.nodes
    assert [m.id for m in maps] == [f"map_doc{i}" for i in range(10)]
    assert reduce.id == "reduce" and set(reduce.depends_on) == {m.id for m in maps}
    assert reduce.prompt_template is not None
    used = {ref.name for ref in references(reduce.prompt_template)}
    assert used == {m.id for m in maps}
    for doc, node in zip(documents, maps, strict=True):
        assert node.prompt_template is not None
        assert {ref.name for ref in references(node.prompt_template)} == {doc}
        assert node.sampling.max_tokens == 32


def test_parallel_sample_votes_over_differently_seeded_samples() -> None:
    job = job_spec_from_proto(parallel_sample("What is 6 x 7?", 5, temperature=0.9))
    validate_job(job)
    *samples, vote = job.nodes
    assert len({s.sampling.seed for s in samples}) == 5
    assert all(s.sampling.temperature == 0.9 for s in samples)
    assert vote.id == "vote" and vote.depends_on == tuple(s.id for s in samples)
    assert vote.sampling.temperature == 0.0


def test_json_round_trip() -> None:
    spec = map_reduce({"a": "alpha", "b": "beta"})
    assert job_from_json(job_to_json(spec)) == spec


@pytest.mark.parametrize("name", ["map_reduce.json", "parallel_sampling.json"])
def test_examples_are_valid_jobs(name: str) -> None:
    job = job_spec_from_proto(job_from_json((EXAMPLES / name).read_text(encoding="utf-8")))
    validate_job(job)
    *parents, last = job.nodes
    assert len(parents) >= 4
    assert set(last.depends_on) == {node.id for node in parents}


def test_the_documented_example_is_a_valid_job() -> None:
    text = (ROOT / "docs" / "JOBS.md").read_text(encoding="utf-8")
    example = text.split("```json\n", 1)[1].split("```", 1)[0]
    job = job_spec_from_proto(job_from_json(example))
    validate_job(job)
    assert [node.id for node in job.nodes] == ["sum_a", "sum_b", "combine"]


def test_a_stop_string_is_one_stop_not_one_per_character() -> None:
    """`stop="END"` (as the OpenAI API takes it) became the stops E, N and D."""
    spec = JobBuilder().node("a", prompt="hi", stop="END").node("b", prompt="hi", stop=["\n", "."])
    assert [list(n.sampling.stop) for n in spec.build().nodes] == [["END"], ["\n", "."]]


def test_a_parent_named_by_a_string_is_one_parent_not_one_per_character() -> None:
    """`depends_on="first"` became the parents f, i, r, s and t: a job the gateway refused."""
    spec = (
        JobBuilder()
        .node("first", prompt="hi")
        .node("second", prompt="{{first.output}}", depends_on="first")
        .build()
    )
    job = job_spec_from_proto(spec)
    validate_job(job)
    assert job.nodes[1].depends_on == ("first",)
