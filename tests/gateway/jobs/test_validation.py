from __future__ import annotations

import dataclasses
import math
import tracemalloc

import pytest

from engine import MAX_TEMPERATURE, MIN_TEMPERATURE
from gateway.jobs.errors import FieldViolation, JobInvalid
from gateway.jobs.model import ChatMessage, JobSpec, NodeSpec, SamplingSpec
from gateway.jobs.validation import JobLimits, validate_job
from tests.gateway.jobs.factories import make_chat_node, make_job, make_map_reduce, make_node


def violations(
    spec: JobSpec, limits: JobLimits | None = None, now: float | None = None
) -> list[FieldViolation]:
    with pytest.raises(JobInvalid) as caught:
        validate_job(spec, limits, now)
    assert caught.value.violations, "JobInvalid must carry its violations"
    return caught.value.violations


def only(
    spec: JobSpec, limits: JobLimits | None = None, now: float | None = None
) -> FieldViolation:
    (violation,) = violations(spec, limits, now)
    return violation


def chain(length: int) -> JobSpec:
    nodes = [make_node("n0")]
    nodes += [make_node(f"n{i}", depends_on=(f"n{i - 1}",)) for i in range(1, length)]
    return make_job(*nodes)


def test_good_jobs_pass() -> None:
    validate_job(make_map_reduce(10))
    validate_job(make_job(make_chat_node("c", ("system", "Be kind."), ("user", "Hi"))))
    validate_job(make_job(make_node("solo", sampling=SamplingSpec(max_tokens=4096))))


def test_empty_job() -> None:
    assert only(make_job()) == FieldViolation("nodes", "a job needs at least one node")


def test_every_violation_is_reported_at_once() -> None:
    spec = make_job(
        make_node("a", "{{inputs.missing}}", depends_on=("ghost",)),
        make_node("a", "{{b.output}}"),
        make_node("b", sampling=SamplingSpec(temperature=-1.0, top_p=2.0)),
        make_node("bad id"),
    )
    assert [v.field for v in violations(spec)] == [
        "nodes[0].depends_on[0]",
        "nodes[0].prompt_template",
        "nodes[1].id",
        "nodes[1].prompt_template",
        "nodes[2].sampling.temperature",
        "nodes[2].sampling.top_p",
        "nodes[3].id",
    ]
    with pytest.raises(JobInvalid, match=r"nodes\[0\]\.depends_on\[0\]: unknown node 'ghost'"):
        validate_job(spec)


@pytest.mark.parametrize(
    ("node_id", "description"),
    [
        ("", "letters, digits"),
        ("has space", "letters, digits"),
        ("dot.ted", "letters, digits"),
        ("9lives", "starting with a letter"),
        ("x" * 65, "1 to 64"),
        ("inputs", "'inputs' is reserved"),
    ],
)
def test_bad_node_ids(node_id: str, description: str) -> None:
    violation = only(make_job(make_node(node_id)))
    assert violation.field == "nodes[0].id"
    assert description in violation.description


def test_duplicate_ids_point_at_the_repeat() -> None:
    violation = only(make_job(make_node("a"), make_node("b"), make_node("a")))
    assert violation == FieldViolation("nodes[2].id", "duplicate id 'a' (also nodes[0])")


def test_dependencies_unknown_or_repeated() -> None:
    spec = make_job(make_node("a"), make_node("b", depends_on=("a", "zz", "a")))
    assert violations(spec) == [
        FieldViolation("nodes[1].depends_on[1]", "unknown node 'zz'"),
        FieldViolation("nodes[1].depends_on[2]", "'a' is listed twice"),
    ]


def test_cycle_points_at_the_closing_dependency() -> None:
    spec = make_job(
        make_node("a", depends_on=("c",)),
        make_node("b", depends_on=("a",)),
        make_node("c", depends_on=("b",)),
    )
    assert only(spec) == FieldViolation(
        "nodes[1].depends_on[0]", "dependency cycle: 'a' -> 'c' -> 'b' -> 'a'"
    )


def test_self_dependency() -> None:
    spec = make_job(make_node("a", depends_on=("a",)))
    assert only(spec) == FieldViolation("nodes[0].depends_on[0]", "'a' depends on itself")


def test_long_cycle_is_elided() -> None:
    nodes = [make_node(f"n{i}", depends_on=(f"n{(i + 1) % 20}",)) for i in range(20)]
    description = only(make_job(*nodes)).description
    assert description.startswith("dependency cycle: 'n0' -> 'n1' -> ")
    assert description.endswith("-> ... (12 more) -> 'n0'")


def test_references_may_use_any_ancestor() -> None:
    spec = make_job(
        make_node("a"),
        make_node("b", "{{a.output}}", depends_on=("a",)),
        make_node("c", "{{a.output}} {{b.output}}", depends_on=("b",)),
    )
    validate_job(spec)


def test_references_to_non_ancestors_own_output_and_unknowns() -> None:
    spec = make_job(
        make_node("a"),
        make_node("b"),
        make_node("c", "{{b.output}} {{c.output}} {{zz.output}} {{inputs.q}}", depends_on=("a",)),
    )
    described = [v.description for v in violations(spec)]
    assert described == [
        "{{b.output}}: 'b' is not among this node's dependencies; add it to depends_on",
        "{{c.output}}: a node cannot use its own output",
        "{{zz.output}}: unknown node 'zz'",
        "{{inputs.q}}: unknown input 'q'",
    ]


def test_malformed_placeholder_in_a_chat_message() -> None:
    spec = make_job(make_chat_node("c", ("system", "ok"), ("user", "{{ topic }}")))
    violation = only(spec)
    assert violation.field == "nodes[0].chat.messages[1].content"
    assert violation.description.startswith("{{ topic }} is not a reference")


def test_repeated_bad_reference_is_reported_once() -> None:
    spec = make_job(make_node("a", "{{inputs.q}} and again {{inputs.q}}"))
    assert only(spec).description == "{{inputs.q}}: unknown input 'q'"


@pytest.mark.parametrize(
    ("node", "field", "description"),
    [
        (NodeSpec(id="a"), "nodes[0].prompt_template", "a node needs prompt_template or chat"),
        (make_node("a", "  \n"), "nodes[0].prompt_template", "must not be blank"),
        (
            NodeSpec(id="a", prompt_template="x", messages=(ChatMessage("user", "y"),)),
            "nodes[0]",
            "set prompt_template or chat, not both",
        ),
        (NodeSpec(id="a", messages=()), "nodes[0].chat.messages", "at least one message"),
        (
            make_chat_node("a", ("robot", "hi")),
            "nodes[0].chat.messages[0].role",
            "'robot' is not one of system, user, assistant",
        ),
    ],
)
def test_prompt_shape(node: NodeSpec, field: str, description: str) -> None:
    violation = only(make_job(node))
    assert violation.field == field
    assert description in violation.description


@pytest.mark.parametrize(
    ("sampling", "field", "description"),
    [
        (SamplingSpec(max_tokens=0), "max_tokens", "must be at least 1"),
        (SamplingSpec(max_tokens=4097), "max_tokens", "4097 exceeds the ceiling of 4096"),
        (SamplingSpec(temperature=-0.5), "temperature", "must be 0 (greedy) or between"),
        (SamplingSpec(temperature=MIN_TEMPERATURE / 2), "temperature", "0 (greedy) or between"),
        (SamplingSpec(temperature=1e-300), "temperature", "0 (greedy) or between"),
        (SamplingSpec(temperature=MAX_TEMPERATURE * 1.01), "temperature", "0 (greedy) or between"),
        (SamplingSpec(temperature=math.nan), "temperature", "must be a finite number"),
        (SamplingSpec(temperature=math.inf), "temperature", "must be a finite number"),
        (SamplingSpec(temperature=-math.inf), "temperature", "must be a finite number"),
        (SamplingSpec(top_p=math.nan), "top_p", "must be a finite number"),
        (SamplingSpec(top_p=math.inf), "top_p", "must be a finite number"),
        (SamplingSpec(top_p=0.0), "top_p", "greater than 0 and at most 1"),
        (SamplingSpec(top_p=1.01), "top_p", "greater than 0 and at most 1"),
        (SamplingSpec(top_k=-1), "top_k", "at least 0"),
        (SamplingSpec(seed=-1), "seed", "unsigned 64-bit"),
        (SamplingSpec(stop=("x",) * 9), "stop", "9 stop strings; at most 8"),
        (SamplingSpec(stop=("ok", "")), "stop[1]", "must not be empty"),
        (SamplingSpec(stop=("s" * 129,)), "stop[0]", "129 characters; at most 128"),
    ],
)
def test_sampling_ranges(sampling: SamplingSpec, field: str, description: str) -> None:
    violation = only(make_job(make_node("a", sampling=sampling)))
    assert violation.field == f"nodes[0].sampling.{field}"
    assert description in violation.description


def test_sampling_edges_pass() -> None:
    edges = SamplingSpec(max_tokens=1, temperature=0.0, top_p=1.0, top_k=0, seed=2**64 - 1)
    validate_job(make_job(make_node("a", sampling=edges)))
    for temperature in (MIN_TEMPERATURE, MAX_TEMPERATURE, -0.0):
        sampling = SamplingSpec(temperature=temperature, top_p=1e-9)
        validate_job(make_job(make_node("a", sampling=sampling)))


def test_temperature_violation_names_the_engine_range() -> None:
    violation = only(make_job(make_node("a", sampling=SamplingSpec(temperature=0.001))))
    assert violation.description == (
        f"must be 0 (greedy) or between {MIN_TEMPERATURE} and {MAX_TEMPERATURE}"
    )


def test_tenant_ceiling_comes_from_limits() -> None:
    spec = make_job(make_node("a", sampling=SamplingSpec(max_tokens=300)))
    validate_job(spec, JobLimits(max_tokens_ceiling=300))
    violation = only(spec, JobLimits(max_tokens_ceiling=256))
    assert violation.description == "300 exceeds the ceiling of 256"


def test_node_count_limit() -> None:
    validate_job(make_map_reduce(9), JobLimits(max_nodes=10))
    assert only(make_map_reduce(10), JobLimits(max_nodes=10)) == FieldViolation(
        "nodes", "11 nodes; at most 10"
    )


def test_a_job_past_the_node_count_is_told_so_alone() -> None:
    """The graph checks cost up to the nodes times the edges: a job far past the count (a chain
    of 20,000 nodes, about 20 bytes each in a request) is refused before any of them runs, with
    the count alone (it would also break the depth limit)."""
    assert violations(chain(20_000)) == [FieldViolation("nodes", "20000 nodes; at most 256")]


def test_a_node_past_the_dependency_count_is_told_so_alone() -> None:
    """Each listed dependency is checked against the ones before it: a node listing one parent
    100,000 times is refused with one violation, not one per repeat."""
    spec = make_job(make_node("a"), make_node("b", depends_on=("a",) * 100_000))
    assert violations(spec) == [
        FieldViolation("nodes[1].depends_on", "100000 dependencies; at most 256")
    ]


def test_a_cycle_leaves_which_outputs_a_node_may_use_to_after_it_is_broken() -> None:
    spec = make_job(
        make_node("a", "{{b.output}}", depends_on=("b",)),
        make_node("b", "{{c.output}}", depends_on=("a",)),
        make_node("c"),
    )
    assert only(spec).description == "dependency cycle: 'a' -> 'b' -> 'a'"


def test_depth_limit() -> None:
    validate_job(chain(4), JobLimits(max_depth=4))
    violation = only(chain(5), JobLimits(max_depth=4))
    assert violation == FieldViolation(
        "nodes", "the longest dependency chain has 5 nodes (ending at 'n4'); at most 4"
    )


def test_fan_out_limit() -> None:
    def fan(width: int) -> JobSpec:
        kids = [make_node(f"k{i}", depends_on=("root",)) for i in range(width)]
        return make_job(make_node("x"), make_node("root"), *kids)

    validate_job(fan(3), JobLimits(max_fan_out=3))
    assert only(fan(4), JobLimits(max_fan_out=3)) == FieldViolation(
        "nodes[1]", "4 nodes depend on 'root'; at most 3"
    )


def test_template_length_limit() -> None:
    limits = JobLimits(max_template_chars=10)
    validate_job(make_job(make_node("a", "x" * 10)), limits)
    assert only(make_job(make_node("a", "x" * 11)), limits) == FieldViolation(
        "nodes[0].prompt_template", "11 characters; at most 10"
    )
    long_message = make_job(make_chat_node("c", ("user", "y" * 11)))
    assert only(long_message, limits).field == "nodes[0].chat.messages[0].content"


def test_message_count_limit() -> None:
    spec = make_job(make_chat_node("c", *[("user", "hi")] * 3))
    validate_job(spec, JobLimits(max_messages_per_node=3))
    violation = only(spec, JobLimits(max_messages_per_node=2))
    assert violation == FieldViolation("nodes[0].chat.messages", "3 messages; at most 2")


def test_inputs_limits_and_names() -> None:
    limits = JobLimits(max_inputs=3, max_input_chars=5)
    spec = make_job(make_node("a"), inputs={"ok": "12345", "bad name": "x", "long": "123456"})
    assert violations(spec, limits) == [
        FieldViolation(
            'inputs["bad name"]',
            "an input name is 1 to 64 letters, digits, '_' or '-', starting with a letter or '_'",
        ),
        FieldViolation('inputs["long"]', "6 characters; at most 5"),
    ]


def test_counts_past_their_limits_are_told_alone_before_any_item_is_checked() -> None:
    """Every later check works per item: a job with too many inputs, messages or stop strings
    is refused with its counts alone (its many items are not each checked: 400,000 empty
    messages took 2.9 s before), and only then are its templates' characters and placeholders
    (each `{{`) added up, refused alone too."""
    chat = make_chat_node("c", *[("", "{{x")] * 100_000)
    spec = make_job(chat, inputs={"x": "1", "y": "bad name is not looked at"})
    assert violations(spec, JobLimits(max_inputs=1)) == [
        FieldViolation("inputs", "2 inputs; at most 1"),
        FieldViolation("nodes[0].chat.messages", "100000 messages; at most 64"),
    ]
    stops = make_job(make_node("a", sampling=SamplingSpec(stop=("",) * 9)))
    assert violations(stops) == [
        FieldViolation("nodes[0].sampling.stop", "9 stop strings; at most 8")
    ]
    limits = JobLimits(max_job_template_chars=40, max_placeholders=2)
    bomb = make_job(make_node("a", "{{inputs.x}} {{inputs.x}} {{inputs.x}} " + "?" * 10))
    assert violations(bomb, limits) == [
        FieldViolation("nodes", "49 template chars; at most 40"),
        FieldViolation("nodes", "3 placeholders ({{) in all; at most 2"),
    ]


def test_a_dense_cyclic_graph_shows_32_cycles_and_says_there_are_more() -> None:
    """40 nodes each depending on every other close 780 cycles: they are looked for only up to
    one more than are shown (all 32,640 of 256 such nodes were, twice: 0.4 s)."""
    ids = [f"n{i}" for i in range(40)]
    spec = make_job(*(make_node(i, "x", tuple(o for o in ids if o != i)) for i in ids))
    found = violations(spec)
    assert len(found) == 33 and all(v.field.endswith("]") for v in found[:32])
    assert found[32] == FieldViolation("nodes", "more dependency cycles than the 32 shown")


def test_job_fields() -> None:
    limits = JobLimits(max_name_chars=4, min_priority=-1, max_priority=1)
    base = make_job(make_node("a"))
    validate_job(dataclasses.replace(base, name="abcd", priority=1), limits)
    spec = dataclasses.replace(base, name="abcde", idempotency_key="k" * 5, priority=2)
    assert [v.field for v in violations(spec, limits)] == ["name", "idempotency_key", "priority"]
    long_node_name = make_job(dataclasses.replace(make_node("a"), name="kind5"))
    assert only(long_node_name, limits).field == "nodes[0].name"


def bomb(repeats: int = 400, input_chars: int = 125_000) -> JobSpec:
    """A ~125 KB request whose one prompt renders to repeats * input_chars characters."""
    return make_job(make_node("boom", "{{inputs.x}}" * repeats), inputs={"x": "x" * input_chars})


def test_render_bomb_is_refused_naming_the_node_and_the_bound() -> None:
    spec = make_job(make_node("ok"), *bomb().nodes, inputs=dict(bomb().inputs))
    with pytest.raises(JobInvalid) as refused:
        validate_job(spec)
    node, job = refused.value.violations  # the node's bound, and the job's
    assert node == FieldViolation(
        "nodes[1]", "renders to at least 50,000,000 characters; at most 262,144"
    )
    assert job.field == "nodes" and "4,194,304" in job.description


def test_rendered_size_is_checked_without_rendering() -> None:
    spec = bomb()
    tracemalloc.start()
    try:
        with pytest.raises(JobInvalid):
            validate_job(spec)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024


def test_prompt_size_limit_sums_chat_messages_and_counts_outputs_as_empty() -> None:
    limits = JobLimits(max_prompt_chars=10)
    at_limit = make_chat_node("c", ("system", "12{{inputs.x}}"), ("user", "{{a.output}}123"))
    spec = make_job(make_node("a"), dataclasses.replace(at_limit, depends_on=("a",)))
    validate_job(dataclasses.replace(spec, inputs={"x": "12345"}), limits)
    assert only(dataclasses.replace(spec, inputs={"x": "123456"}), limits) == FieldViolation(
        "nodes[1]", "renders to at least 11 characters; at most 10"
    )


@pytest.mark.parametrize(
    ("deadline", "now", "description"),
    [
        (math.nan, None, "must be a finite time"),
        (math.inf, 100.0, "must be a finite time"),
        (-math.inf, None, "must be a finite time"),
        (99.5, 100.0, "has already passed: 99.500 is not after the submission time 100.000"),
        (100.0, 100.0, "has already passed"),
        # past what a Timestamp holds: the journal could not write it (and the job failed
        # INTERNAL, its admission held)
        (9.2e18, 100.0, "must be before the year 10000"),
    ],
)
def test_deadline_must_be_finite_and_ahead(
    deadline: float, now: float | None, description: str
) -> None:
    spec = dataclasses.replace(make_job(make_node("a")), deadline_unix_s=deadline)
    violation = only(spec, now=now)
    assert violation.field == "deadline"
    assert description in violation.description


def test_deadline_edges_pass() -> None:
    spec = dataclasses.replace(make_job(make_node("a")), deadline_unix_s=100.001)
    validate_job(spec, now=100.0)
    validate_job(dataclasses.replace(spec, deadline_unix_s=-5.0))  # no clock: no "passed" rule
    validate_job(dataclasses.replace(spec, deadline_unix_s=253_402_300_799.0), now=100.0)


def test_violations_quote_client_text_cut_short() -> None:
    spec = make_job(
        make_node("i" * 1000, "{{ " + "y" * 5000 + " }} {{inputs." + "q" * 5000 + "}}"),
        make_node("b", depends_on=("g" * 1000,)),
        inputs={"n" * 1000: "v"},
    )
    found = violations(spec)
    assert len(found) == 5
    assert all(len(v.field) <= 60 and len(v.description) <= 160 for v in found)
    assert found[-1] == FieldViolation("nodes[1].depends_on[0]", f"unknown node '{'g' * 32}…'")


def test_violations_stop_at_a_byte_budget_and_say_more_were_left_out() -> None:
    spec = make_job(*[make_node(f"n{i}", depends_on=("ghost",)) for i in range(200)])
    found = violations(spec)
    kept = len(found) - 1
    assert sum(len(v.field) + len(v.description) for v in found[:kept]) <= 4096
    assert found[-1] == FieldViolation(f"nodes[{kept}].depends_on[0]", "more not shown")
    assert str(JobInvalid(found)) == (
        f"invalid job: nodes[0].depends_on[0]: unknown node 'ghost' (and {kept} more)"
    )


def test_a_job_whose_prompts_add_up_past_the_job_bound_is_refused() -> None:
    nodes = tuple(make_node(f"n{i}", "{{inputs.doc}}") for i in range(20))
    spec = JobSpec(nodes=nodes, inputs={"doc": "x" * 100_000})  # each node is within its bound
    limits = JobLimits(max_job_prompt_chars=1_000_000)
    with pytest.raises(JobInvalid) as refused:
        validate_job(spec, limits)
    assert [v.field for v in refused.value.violations] == ["nodes"]
    assert "2,000,000 characters in all" in refused.value.violations[0].description


def test_inputs_no_node_uses_count_toward_the_job_bound_too() -> None:
    """They are kept with the job all the same."""
    limits = JobLimits(max_input_chars=8, max_job_prompt_chars=10)
    spec = make_job(make_node("a", "{{inputs.used}}"), inputs={"used": "x" * 6, "spare": "y" * 6})
    assert only(spec, limits) == FieldViolation("inputs", "12 characters in all; at most 10")


def test_a_node_names_a_model_the_gateway_serves_or_none() -> None:
    limits = JobLimits(models=frozenset({"small", "large"}))
    fine = make_job(dataclasses.replace(make_node("a"), model="large"), make_node("b"))
    validate_job(fine, limits)
    unknown = make_job(dataclasses.replace(make_node("a"), model="huge"))
    assert violations(unknown, limits) == [
        FieldViolation("nodes[0].model", "unknown model 'huge'; served: large, small")
    ]
    long_name = make_job(dataclasses.replace(make_node("a"), model="m" * 200))
    assert [v.field for v in violations(long_name)] == ["nodes[0].model"]
