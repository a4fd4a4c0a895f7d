"""Job validation: every rule a job must keep before it is admitted, all violations at once.

Algorithm: first the counts that bound the graph checks' work (nodes, and each node's dependencies:
those checks cost up to the nodes times the edges), so a job past one is refused with those
violations alone, after one pass over its nodes. Then independent checks walk the spec — job
fields, deadline and inputs, then each node (id, dependencies, prompt, template references,
rendered size, sampling), then the graph (cycles, depth, fan-out) — and each yields FieldViolations
whose `field` is a path relative to JobSpec, e.g. `nodes[3].depends_on[0]`. `validate_job` raises
JobInvalid with the list, or returns. The list travels back in gRPC trailers, which clients cap at
8 KiB, so a violation quotes at most `_SHOWN_CHARS` of any text the client sent and the list stops
at `_VIOLATION_BYTES`, its last violation saying that more were left out; the checks are drawn one
violation at a time and no further, so a job that breaks a rule per edge is refused as cheaply.
Reference rule: a template may use the output of any node it reaches through depends_on (a parent
or a parent's ancestor); those are exactly the nodes that have finished when it renders (with a
cycle the rule waits: the cycle is reported, and which nodes a node reaches is defined once it is
broken). Size rule: a
node's prompt, counting its inputs at their length and its parents' outputs as empty, is at most
`max_prompt_chars`; it is computed from sizes, never rendered. Invariant: a job that passes has at
least one node, unique well-formed ids, only known dependencies and references, no cycle, every
limit of JobLimits kept, finite sampling values in the engine's ranges, a finite deadline (not yet
passed at `now`, when given), and every node exactly one prompt (a non-blank template or at least
one chat message) — so `Dag.of_job` cannot fail on it, nor can `template.render_node` once the
node's ancestors have outputs.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from engine import MAX_TEMPERATURE, MIN_TEMPERATURE
from gateway.jobs.dag import Dag, find_cycles
from gateway.jobs.errors import DagCyclic, FieldViolation, JobInvalid
from gateway.jobs.model import CHAT_ROLES, JobSpec, NodeSpec, SamplingSpec
from gateway.jobs.template import (
    IDENTIFIER,
    RefKind,
    malformed_placeholders,
    references,
    rendered_chars,
)

RESERVED_IDS = frozenset({"inputs"})
_IDENTIFIER = re.compile(IDENTIFIER)
_CYCLE_SHOWN = 8  # ids of a cycle spelt out in its violation before eliding the rest
_SHOWN_CHARS = 32  # of an id, name or placeholder quoted in a violation
_VIOLATION_BYTES = 4096  # UTF-8 of the violations' fields and descriptions, all together
# the last second a protobuf Timestamp holds (9999-12-31T23:59:59Z): a deadline is journaled as one
LATEST_DEADLINE = 253_402_300_799
# a job's placeholders (`JobLimits.max_placeholders`) on average a node: a tenant allowed more
# nodes uses more
PLACEHOLDERS_PER_NODE = 16
_CYCLES_SHOWN = 32  # cycles reported (one more is looked for, to say that there are more)


@dataclass(frozen=True, slots=True)
class JobLimits:
    """Caps on a job's shape and settings; build one per tenant from its quota."""

    max_nodes: int = 256
    max_depth: int = 32  # nodes on the longest dependency chain
    max_fan_out: int = 128  # nodes depending on one node
    max_template_chars: int = 32_768  # per template (prompt or one chat message)
    max_messages_per_node: int = 64
    max_inputs: int = 128
    max_input_chars: int = 131_072  # per input value
    max_prompt_chars: int = 262_144  # per node, all its templates rendered with inputs filled in
    max_job_prompt_chars: int = 4_194_304  # all nodes together: what admission renders, encodes
    max_id_chars: int = 64  # node ids and input names
    # the models a node may name (empty names the default); empty: any (nothing to check against)
    models: frozenset[str] = frozenset()
    max_name_chars: int = 128  # job name, node name, idempotency key
    max_tokens_ceiling: int = 4096
    max_stop_sequences: int = 8
    max_stop_chars: int = 128
    min_priority: int = -1000
    max_priority: int = 1000
    # all nodes' templates as written, and the `{{` in them: the job holds them while it runs
    # and every check and render works per placeholder, whatever they render to (a placeholder
    # may render to nothing, so the rendered size bounds neither)
    max_job_template_chars: int = 4_194_304
    max_placeholders: int = PLACEHOLDERS_PER_NODE * 256


@dataclass(frozen=True, slots=True)
class NodeCounts:
    messages: int
    stop: int
    depends_on: int


@dataclass(frozen=True, slots=True)
class JobCounts:
    """Each repeated field's length: what every later check of a job works through item by
    item. The servicers read them off a request before converting it (a 16 MiB request holds
    millions of items, each converted and checked at microseconds), once its node count is
    known to be within the limit (`check_node_count`), so reading them costs a step a node."""

    nodes: Sequence[NodeCounts]
    inputs: int

    @classmethod
    def of(cls, spec: JobSpec) -> JobCounts:
        nodes = [
            NodeCounts(len(node.messages or ()), len(node.sampling.stop), len(node.depends_on))
            for node in spec.nodes
        ]
        return cls(nodes, len(spec.inputs))


@dataclass(frozen=True, slots=True)
class _Job:
    """The spec with the lookups every check needs; a repeated id maps to its first node."""

    spec: JobSpec
    limits: JobLimits
    first_index: Mapping[str, int]  # node id -> index of the first node with it
    edges: Mapping[str, Sequence[str]]  # node id -> depends_on of that first node
    input_chars: Mapping[str, int]  # input name -> length of its value
    # each node's rendered size, outputs counted as empty: the parents have not run, so this
    # is the least its prompt takes
    prompt_chars: Sequence[int]
    cycles: Sequence[Sequence[str]]  # among the known dependencies
    dag: Dag | None  # of the known dependencies; None with a cycle

    @property
    def chars(self) -> int:
        """What `job_chars` says of its spec."""
        return sum(self.input_chars.values()) + sum(self.prompt_chars)

    @classmethod
    def of(cls, spec: JobSpec, limits: JobLimits) -> _Job:
        first_index: dict[str, int] = {}
        for i, node in enumerate(spec.nodes):
            first_index.setdefault(node.id, i)
        edges = {node_id: spec.nodes[i].depends_on for node_id, i in first_index.items()}
        input_chars = input_sizes(spec.inputs)
        prompt_chars = [rendered_chars(node, input_chars, {}) for node in spec.nodes]
        known = {node: [p for p in deps if p in edges] for node, deps in edges.items()}
        try:  # the cycles are looked for only when the order cannot place every node
            dag, cycles = Dag.build(known), []
        except DagCyclic:
            dag, cycles = None, find_cycles(known, _CYCLES_SHOWN + 1)
        return cls(spec, limits, first_index, edges, input_chars, prompt_chars, cycles, dag)


def input_sizes(inputs: Mapping[str, str]) -> dict[str, int]:
    """Each input's length, what `rendered_chars` reads."""
    return {name: len(value) for name, value in inputs.items()}


# what one tenant's admitted, unfinished jobs on one replica hold together (`job_chars`) by
# default: 8 jobs of the most a job may hold (its inputs and its prompts, 4 Mi characters
# each), at about 3 bytes a character as they run
MAX_QUEUED_CHARS = 64 << 20


def job_chars(spec: JobSpec) -> int:
    """The characters a job holds while it runs, from value sizes alone: its inputs and its
    nodes' prompts rendered with empty outputs (its ready calls hold their prompts' token ids,
    so a job of a few kilobytes that repeats a large input into every node holds megabytes).
    `validate_job` returns it for a job it checked."""
    return _Job.of(spec, JobLimits()).chars


def oversized_prompt(size: int, limit: int) -> str | None:
    """Why a prompt of `size` characters (at least) breaks `limit`, or None when it does not:
    checked at submission and again before a node with parents is rendered."""
    if size <= limit:
        return None
    return f"renders to at least {size:,} characters; at most {limit:,}"


def validate_job(spec: JobSpec, limits: JobLimits | None = None, now: float | None = None) -> int:
    """Raise JobInvalid listing every violation of the spec; with none, return its
    `job_chars` (its sizes are computed here already).

    `now` (seconds since the epoch) is the submission time a deadline must still be ahead of;
    the caller reads the clock, so validation stays a pure function of its arguments.
    """
    limits = limits or JobLimits()
    check_node_count(len(spec.nodes), limits)
    check_counts(JobCounts.of(spec), limits)
    check_templates([t for node in spec.nodes for _, t in node.templates()], limits)
    job = _Job.of(spec, limits)
    violations = _bounded(
        itertools.chain(
            _check_job_fields(spec, job.limits),
            _check_deadline(spec.deadline_unix_s, now),
            (v for i, node in enumerate(spec.nodes) for v in _check_node(i, node, job)),
            _check_graph(job),
            _check_job_size(job),
        )
    )
    if violations:
        raise JobInvalid(violations)
    return job.chars


def _bounded(violations: Iterable[FieldViolation]) -> list[FieldViolation]:
    """The leading violations that fit in _VIOLATION_BYTES, then one saying that more were left
    out, drawn no further: a job of 256 nodes that lists 256 unknown dependencies each breaks
    65,536 rules, and spelling every one out held the event loop for a good part of a second."""
    kept: list[FieldViolation] = []
    used = 0
    for violation in violations:
        used += len(violation.field.encode()) + len(violation.description.encode())
        if used > _VIOLATION_BYTES:
            return [*kept, FieldViolation(violation.field, "more not shown")]
        kept.append(violation)
    return kept


def check_node_count(count: int, limits: JobLimits) -> None:
    """Raise JobInvalid for a job of more than `limits.max_nodes` nodes: the servicers ask before
    they convert a request's job, which costs microseconds a node (a 16 MiB request holds
    800,000), and `validate_job` asks first."""
    if count > limits.max_nodes:
        raise JobInvalid([FieldViolation("nodes", f"{count} nodes; at most {limits.max_nodes}")])


def check_counts(counts: JobCounts, limits: JobLimits) -> None:
    """Raise JobInvalid for a job with more of any repeated item than its limits allow: every
    later check works per item (the graph's per dependency), so these come first."""
    violations = list(_over("inputs", counts.inputs, limits.max_inputs, "inputs"))
    for i, node in enumerate(counts.nodes):
        at = f"nodes[{i}]"
        violations += [
            *_over(f"{at}.chat.messages", node.messages, limits.max_messages_per_node, "messages"),
            *_over(f"{at}.sampling.stop", node.stop, limits.max_stop_sequences, "stop strings"),
            *_over(f"{at}.depends_on", node.depends_on, limits.max_nodes, "dependencies"),
        ]
    if violations:
        raise JobInvalid(_bounded(violations))


def check_templates(templates: Sequence[str], limits: JobLimits) -> None:
    """Raise JobInvalid for a job whose templates as written hold more characters or
    placeholders (each `{{`) than its limits allow; asked once the counts are known to be
    within theirs (`check_counts`), so the templates are at most a node's messages a node."""
    chars, placeholders = sum(map(len, templates)), sum(t.count("{{") for t in templates)
    violations = [
        *_over("nodes", chars, limits.max_job_template_chars, "template chars"),
        *_over("nodes", placeholders, limits.max_placeholders, "placeholders ({{) in all"),
    ]
    if violations:
        raise JobInvalid(violations)


def _over(field: str, count: int, limit: int, what: str) -> Iterator[FieldViolation]:
    if count > limit:
        yield FieldViolation(field, f"{count} {what}; at most {limit}")


def _check_job_fields(spec: JobSpec, limits: JobLimits) -> Iterator[FieldViolation]:
    if not spec.nodes:
        yield FieldViolation("nodes", "a job needs at least one node")
    yield from _check_length("name", spec.name, limits.max_name_chars)
    yield from _check_length("idempotency_key", spec.idempotency_key, limits.max_name_chars)
    if not limits.min_priority <= spec.priority <= limits.max_priority:
        yield FieldViolation(
            "priority", f"must be between {limits.min_priority} and {limits.max_priority}"
        )
    yield from _check_inputs(spec.inputs, limits)


def _check_deadline(deadline: float | None, now: float | None) -> Iterator[FieldViolation]:
    if deadline is None:
        return
    if not math.isfinite(deadline):
        yield FieldViolation("deadline", "must be a finite time")
    elif deadline > LATEST_DEADLINE:  # past what a Timestamp holds: it could not be journaled
        yield FieldViolation("deadline", "must be before the year 10000")
    elif now is not None and deadline <= now:
        yield FieldViolation(
            "deadline",
            f"has already passed: {deadline:.3f} is not after the submission time {now:.3f} "
            "(seconds since the epoch)",
        )


def _check_inputs(inputs: Mapping[str, str], limits: JobLimits) -> Iterator[FieldViolation]:
    for name, value in inputs.items():
        field = f"inputs[{json.dumps(_cut(name), ensure_ascii=False)}]"
        if not _is_identifier(name, limits):
            yield FieldViolation(field, _identifier_rule("an input name", limits))
        yield from _check_length(field, value, limits.max_input_chars)


def _check_node(index: int, node: NodeSpec, job: _Job) -> Iterator[FieldViolation]:
    at = f"nodes[{index}]"
    yield from _check_id(at, index, node.id, job)
    yield from _check_length(f"{at}.name", node.name, job.limits.max_name_chars)
    yield from _check_model(f"{at}.model", node.model, job.limits)
    yield from _check_depends_on(at, node, job.edges)
    yield from _check_prompt(at, node, job.limits)
    yield from _check_references(at, node, job)
    yield from _check_rendered_size(at, index, job)
    yield from _check_sampling(f"{at}.sampling", node.sampling, job.limits)


def _check_model(at: str, model: str, limits: JobLimits) -> Iterator[FieldViolation]:
    yield from _check_length(at, model, limits.max_name_chars)
    if model and limits.models and model not in limits.models:
        served = ", ".join(sorted(limits.models))
        yield FieldViolation(at, f"unknown model {_cut(model)!r}; served: {served}")


def _check_id(at: str, index: int, node_id: str, job: _Job) -> Iterator[FieldViolation]:
    if not _is_identifier(node_id, job.limits):
        yield FieldViolation(f"{at}.id", _identifier_rule("a node id", job.limits))
    elif node_id in RESERVED_IDS:
        yield FieldViolation(f"{at}.id", f"{_cut(node_id)!r} is reserved")
    first = job.first_index[node_id]
    if first != index:
        yield FieldViolation(f"{at}.id", f"duplicate id {_cut(node_id)!r} (also nodes[{first}])")


def _check_depends_on(
    at: str, node: NodeSpec, edges: Mapping[str, Sequence[str]]
) -> Iterator[FieldViolation]:
    listed: set[str] = set()
    for k, parent in enumerate(node.depends_on):
        field = f"{at}.depends_on[{k}]"
        if parent not in edges:
            yield FieldViolation(field, f"unknown node {_cut(parent)!r}")
        elif parent in listed:
            yield FieldViolation(field, f"{_cut(parent)!r} is listed twice")
        listed.add(parent)


def _check_prompt(at: str, node: NodeSpec, limits: JobLimits) -> Iterator[FieldViolation]:
    if node.prompt_template is not None and node.messages is not None:
        yield FieldViolation(at, "set prompt_template or chat, not both")
    elif node.prompt_template is None and node.messages is None:
        yield FieldViolation(f"{at}.prompt_template", "a node needs prompt_template or chat")
    elif node.prompt_template is not None and not node.prompt_template.strip():
        yield FieldViolation(f"{at}.prompt_template", "must not be blank")
    if node.messages is not None:
        yield from _check_messages(f"{at}.chat.messages", node, limits)
    for field, template in node.templates():
        yield from _check_length(f"{at}.{field}", template, limits.max_template_chars)


def _check_messages(at: str, node: NodeSpec, limits: JobLimits) -> Iterator[FieldViolation]:
    messages = node.messages or ()
    if not messages:
        yield FieldViolation(at, "chat needs at least one message")
    for k, message in enumerate(messages):
        if message.role not in CHAT_ROLES:
            yield FieldViolation(
                f"{at}[{k}].role", f"{_cut(message.role)!r} is not one of {', '.join(CHAT_ROLES)}"
            )


def _check_references(at: str, node: NodeSpec, job: _Job) -> Iterator[FieldViolation]:
    # with a cycle, which outputs a node may use is not defined until it is broken
    reachable = None if job.dag is None else job.dag.ancestors(node.id)
    for field, template in node.templates():
        for placeholder in dict.fromkeys(malformed_placeholders(template)):
            yield FieldViolation(
                f"{at}.{field}",
                f"{_cut(placeholder)} is not a reference: use {{{{inputs.NAME}}}} or "
                "{{NODE_ID.output}}",
            )
        for ref in dict.fromkeys(references(template)):
            problem = _reference_problem(ref.kind, ref.name, node.id, job, reachable)
            if problem:
                yield FieldViolation(f"{at}.{field}", f"{_cut(ref.placeholder)}: {problem}")


def _reference_problem(
    kind: RefKind, name: str, node_id: str, job: _Job, reachable: frozenset[str] | None
) -> str | None:
    if kind is RefKind.INPUT:
        return None if name in job.spec.inputs else f"unknown input {_cut(name)!r}"
    if name == node_id:
        return "a node cannot use its own output"
    if name not in job.edges:
        return f"unknown node {_cut(name)!r}"
    if reachable is not None and name not in reachable:
        return f"{_cut(name)!r} is not among this node's dependencies; add it to depends_on"
    return None


def _check_job_size(job: _Job) -> Iterator[FieldViolation]:
    """Admission renders and encodes every node's prompt: the sum is bounded too, and so are the
    inputs together (one no node uses is still kept with the job)."""
    inputs = sum(job.input_chars.values())
    if inputs > job.limits.max_job_prompt_chars:
        yield FieldViolation(
            "inputs",
            f"{inputs:,} characters in all; at most {job.limits.max_job_prompt_chars:,}",
        )
    total = sum(job.prompt_chars)
    if total > job.limits.max_job_prompt_chars:
        yield FieldViolation(
            "nodes",
            f"the prompts render to at least {total:,} characters in all; at most "
            f"{job.limits.max_job_prompt_chars:,}",
        )


def _check_rendered_size(at: str, index: int, job: _Job) -> Iterator[FieldViolation]:
    problem = oversized_prompt(job.prompt_chars[index], job.limits.max_prompt_chars)
    if problem is not None:
        yield FieldViolation(at, problem)


def _check_sampling(at: str, sampling: SamplingSpec, limits: JobLimits) -> Iterator[FieldViolation]:
    if sampling.max_tokens is not None and sampling.max_tokens < 1:
        yield FieldViolation(f"{at}.max_tokens", "must be at least 1")
    elif sampling.max_tokens is not None and sampling.max_tokens > limits.max_tokens_ceiling:
        yield FieldViolation(
            f"{at}.max_tokens",
            f"{sampling.max_tokens} exceeds the ceiling of {limits.max_tokens_ceiling}",
        )
    yield from _check_temperature(f"{at}.temperature", sampling.temperature)
    yield from _check_top_p(f"{at}.top_p", sampling.top_p)
    if sampling.top_k is not None and sampling.top_k < 0:
        yield FieldViolation(f"{at}.top_k", "must be at least 0 (0 turns top-k off)")
    if sampling.seed is not None and not 0 <= sampling.seed < 2**64:
        yield FieldViolation(f"{at}.seed", "must be an unsigned 64-bit integer")
    yield from _check_stop(f"{at}.stop", sampling.stop, limits)


def _check_temperature(field: str, temperature: float | None) -> Iterator[FieldViolation]:
    """0 is greedy; any other value must lie in the range the engine samples in, which it owns."""
    if temperature is None:
        return
    if not math.isfinite(temperature):
        yield FieldViolation(field, "must be a finite number")
    elif not (temperature == 0.0 or MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE):
        yield FieldViolation(
            field, f"must be 0 (greedy) or between {MIN_TEMPERATURE} and {MAX_TEMPERATURE}"
        )


def _check_top_p(field: str, top_p: float | None) -> Iterator[FieldViolation]:
    if top_p is None:
        return
    if not math.isfinite(top_p):
        yield FieldViolation(field, "must be a finite number")
    elif not 0.0 < top_p <= 1.0:
        yield FieldViolation(field, "must be greater than 0 and at most 1")


def _check_stop(at: str, stop: Sequence[str], limits: JobLimits) -> Iterator[FieldViolation]:
    for k, text in enumerate(stop):
        if not text:
            yield FieldViolation(f"{at}[{k}]", "must not be empty")
        yield from _check_length(f"{at}[{k}]", text, limits.max_stop_chars)


def _check_graph(job: _Job) -> Iterator[FieldViolation]:
    for cycle in job.cycles[:_CYCLES_SHOWN]:
        index = job.first_index[cycle[-1]]
        closing = job.spec.nodes[index].depends_on.index(cycle[0])
        yield FieldViolation(f"nodes[{index}].depends_on[{closing}]", _describe_cycle(cycle))
    if len(job.cycles) > _CYCLES_SHOWN:
        yield FieldViolation("nodes", f"more dependency cycles than the {_CYCLES_SHOWN} shown")
    dag = job.dag
    if dag is None or not dag.order:
        return
    depths = dag.depths()
    deepest = max(depths, key=depths.__getitem__)
    if depths[deepest] > job.limits.max_depth:
        yield FieldViolation(
            "nodes",
            f"the longest dependency chain has {depths[deepest]} nodes (ending at "
            f"{_cut(deepest)!r}); at most {job.limits.max_depth}",
        )
    for node_id, kids in dag.children.items():
        if len(kids) > job.limits.max_fan_out:
            yield FieldViolation(
                f"nodes[{job.first_index[node_id]}]",
                f"{len(kids)} nodes depend on {_cut(node_id)!r}; at most {job.limits.max_fan_out}",
            )


def _describe_cycle(cycle: Sequence[str]) -> str:
    if len(cycle) == 1:
        return f"{_cut(cycle[0])!r} depends on itself"
    shown = [repr(_cut(node)) for node in cycle[:_CYCLE_SHOWN]]
    if len(cycle) > _CYCLE_SHOWN:
        shown.append(f"... ({len(cycle) - _CYCLE_SHOWN} more)")
    return "dependency cycle: " + " -> ".join([*shown, repr(_cut(cycle[0]))])


def _is_identifier(text: str, limits: JobLimits) -> bool:
    return len(text) <= limits.max_id_chars and _IDENTIFIER.fullmatch(text) is not None


def _identifier_rule(what: str, limits: JobLimits) -> str:
    return (
        f"{what} is 1 to {limits.max_id_chars} letters, digits, '_' or '-', "
        "starting with a letter or '_'"
    )


def _check_length(field: str, text: str, limit: int) -> Iterator[FieldViolation]:
    if len(text) > limit:
        yield FieldViolation(field, f"{len(text)} characters; at most {limit}")


def _cut(text: str) -> str:
    """Client text as a violation quotes it: an id or a placeholder may be kilobytes long."""
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"
