"""Hypothesis strategies for gateway requests: JobSpec and GenerateRequest protos, clean or dirty.

A clean request keeps every rule of JobLimits and the `wide` tenant's max_tokens ceiling while
using extreme legal values: sizes exactly at each limit, greedy and hottest temperatures, huge
top_k, seeds at 2**64 - 1, deadlines centuries ahead, RTL, NUL and astral text. A dirty one may
break any rule as well: sizes one past each limit, cycles, self and unknown dependencies,
duplicate and malformed ids, references unknown, to non-ancestors or malformed, NaN and infinite
floats, past deadlines — usually several at once. Big texts are one character repeated and
choices are drawn from prebuilt strategies, so an example is cheap to draw whatever its size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from hypothesis import strategies as st

from fairgate.v1 import gateway_pb2 as pb
from gateway.jobs import JobLimits
from tests.reliability.conftest import QUOTAS

T = TypeVar("T")
LIMITS = JobLimits()
CEILING = QUOTAS["wide"].max_tokens_ceiling
FUTURE_S = 4_102_444_800  # 2100-01-01
SMALL_JOB = 6  # jobs of at most this many nodes draw each prompt; bigger ones follow their shape


def either(clean: Sequence[T], dirty: Sequence[T]) -> tuple[st.SearchStrategy[T], ...]:
    """(clean strategy, dirty strategy): the dirty one draws from both lists."""
    return st.sampled_from(tuple(clean)), st.sampled_from((*clean, *dirty))


def at_and_past(limit: int) -> tuple[list[int], list[int]]:
    return [limit], [limit + 1]


UNITS = st.sampled_from(("x", "é", "🦉", "\u202e", "\u05d0", "\x00", " "))
# Words are mostly picked from a pool (one choice each, cheap), sometimes any text at all
POOL = st.sampled_from(
    (
        *("hi", "Summarise:", "\n", "\x00", "a\x00b", "\u202eevil", "שלום", "مرحبا", "日本語"),
        *("🦉", "\U0010ffff", "e\u0301", "👩\u200d💻", "\ufeff", "\r\n", "\t", "{", "}}"),
        *("{{{", " {{ }} "),
    )
)
WORDS = st.one_of(
    POOL, POOL, POOL, st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=6)
)
STOPS = either(["\n\n", "END", "🦉", "s" * LIMITS.max_stop_chars], ["", "s" * 129])
STOP_COUNTS = either([0, 0, 1, LIMITS.max_stop_sequences], [LIMITS.max_stop_sequences + 1])
SAMPLING = {
    "max_tokens": either([None, 1, 4, CEILING], [0, -1, CEILING + 1, 2**31 - 1, -(2**31)]),
    "temperature": either(
        [None, 0.0, -0.0, 0.01, 0.7, 100.0],
        [0.005, 1e-300, 5e-324, -1.0, 100.5, 1e308, float("nan"), float("inf"), float("-inf")],
    ),
    "top_p": either(
        [None, 1e-9, 0.5, 1.0], [0.0, 1.0000001, 2.0, -0.1, float("nan"), float("inf")]
    ),
    "top_k": either([None, 0, 1, 2**31 - 1], [-1, -(2**31)]),
    "seed": either([None, 0, 2**64 - 1], []),
}
NAMES = either(["", "summary", "n" * LIMITS.max_name_chars, "\u202e🦉\x00"], ["n" * 129])
KEYS = either(["", "", "", "k0", "k1", "k2", "🦉", "k" * LIMITS.max_name_chars], ["k" * 129])
PRIORITIES = either([0, 5, LIMITS.min_priority, LIMITS.max_priority], [-1001, 1001, 2**31 - 1])
DEADLINES = either(
    [None, (FUTURE_S, 0), (253_402_300_799, 999_999_999), (2**40, 0)],
    [(1_000_000_000, 0), (-62_135_596_800, 0), (0, -1), (FUTURE_S, 10**9), (2**63 - 1, 0)],
)
INPUT_NAMES = either(["doc", "q", "x_1", "a-b", "_" + "x" * 63], ["", "9x", "a b", "x" * 65, "ñ"])
INPUT_KINDS = either(["few", "few", "few", "many", "big"], [])
INPUT_COUNTS = either(*at_and_past(LIMITS.max_inputs))
INPUT_CHARS = either(*at_and_past(LIMITS.max_input_chars))
TEMPLATE_CHARS = either(*at_and_past(LIMITS.max_template_chars))
# repeats of the longest input: a prompt at, past and far past max_prompt_chars
BOMBS = either([LIMITS.max_prompt_chars // LIMITS.max_input_chars], [3, 400])
TEMPLATE_KINDS = either(["pieces"] * 6 + ["long", "bomb"], [])
SPACED = st.sampled_from(("{{%s}}", "{{ %s }}", "{{\t%s\n}}"))
MALFORMED = st.sampled_from(
    ("{{ name }}", "{{}}", "{{inputs.}}", "{{a.b.output}}", "{{ 1a.output }}", "{{inputs.x.y}}")
)
BRACES = st.sampled_from(("{", "}", "{{{", "}}}", "{{", "}}", "{{inputs.doc}"))
PROMPT_KINDS = either(["template"] * 4 + ["chat"], ["none"])
ROLES = either(["system", "user", "assistant"], ["robot", ""])
MESSAGE_COUNTS = either([1, 2, 3, LIMITS.max_messages_per_node], [0, 65])
# (shape, node count): a clean job stays within max_depth, max_fan_out and max_nodes
SMALL_SHAPES = [
    (shape, count)
    for shape in ("chain", "fan_out", "fan_in", "random")
    for count in range(1, SMALL_JOB + 1)
]
SHAPES = either(
    [
        *SMALL_SHAPES,
        ("chain", LIMITS.max_depth),
        ("fan_out", LIMITS.max_fan_out + 1),
        ("fan_in", LIMITS.max_nodes),
    ],
    [
        ("chain", LIMITS.max_depth + 1),
        ("fan_out", LIMITS.max_fan_out + 2),
        ("fan_in", LIMITS.max_nodes + 1),
    ],
)
FAULTS = either(["none"], ["cycle", "self", "unknown", "dup", "bad_id"])
BAD_IDS = st.sampled_from(("", "inputs", "9lives", "a.b", "x" * 65, "ñ", "a\x00", "🦉"))
INDEX = st.integers(0, 2**16)  # an index into a list of any length, taken modulo it
DIRT = st.sampled_from((0, 0, 1))  # a third of the examples break rules
UP_TO_3 = st.integers(0, 3)
COIN = st.booleans()
GENERATE_KINDS = st.sampled_from(("words", "words", "long", "chat", "chat"))
DIRTY_PIECES = WORDS | MALFORMED | BRACES


def pick(draw: st.DrawFn, choices: tuple[st.SearchStrategy[T], ...], dirty: int) -> T:
    return draw(choices[dirty])


def one_of_list(draw: st.DrawFn, items: Sequence[T]) -> T:
    return items[draw(INDEX) % len(items)]


def draw_sampling(draw: st.DrawFn, dirty: int) -> pb.SamplingSpec:
    values = {name: pick(draw, choices, dirty) for name, choices in SAMPLING.items()}
    stop = [pick(draw, STOPS, dirty) for _ in range(pick(draw, STOP_COUNTS, dirty))]
    return pb.SamplingSpec(stop=stop, **{k: v for k, v in values.items() if v is not None})


def draw_inputs(draw: st.DrawFn, dirty: int) -> dict[str, str]:
    """A few short inputs, a great many, or one as long as allowed (named `big`)."""
    kind = pick(draw, INPUT_KINDS, dirty)
    if kind == "many":
        return {f"i{k}": "v" for k in range(pick(draw, INPUT_COUNTS, dirty))}
    if kind == "big":
        return {"big": draw(UNITS) * pick(draw, INPUT_CHARS, dirty)}
    count = draw(UP_TO_3)
    return {pick(draw, INPUT_NAMES, dirty): draw(WORDS) for _ in range(count)}


def dependencies(shape: str, ids: list[str]) -> list[list[str]]:
    if shape == "chain":
        return [[], *([parent] for parent in ids[:-1])]
    if shape == "fan_out":
        return [[], *([ids[0]] for _ in ids[1:])]
    if shape == "fan_in":
        return [*([] for _ in ids[:-1]), ids[:-1]]
    return [[] for _ in ids]


def draw_graph(draw: st.DrawFn, dirty: int) -> tuple[list[str], list[list[str]]]:
    """Ids and depends_on lists: a shape, extra edges to earlier nodes, then perhaps a fault."""
    shape, count = pick(draw, SHAPES, dirty)
    ids = [f"n{i}" for i in range(count)]
    deps = dependencies(shape, ids)
    if shape == "random":
        for i in range(1, count):
            deps[i] = list(dict.fromkeys(one_of_list(draw, ids[:i]) for _ in range(i % 3)))
    k = draw(INDEX) % count
    fault = pick(draw, FAULTS, dirty)
    if fault == "cycle":
        deps[0].append(ids[-1])
    elif fault == "self":
        deps[k].append(ids[k])
    elif fault == "unknown":
        deps[k].append("ghost")
    elif fault == "dup":
        ids[-1] = ids[0]
    elif fault == "bad_id":
        ids[k] = draw(BAD_IDS)
    return ids, deps


def draw_template(draw: st.DrawFn, refs: Sequence[str], bomb: bool, dirty: int) -> str:
    """Text and references to `refs` (bodies such as `inputs.q` or `n0.output`); a dirty one
    also gets malformed placeholders and stray braces. Some are as long as allowed; with `bomb`,
    some repeat the input `big`, which is as long as allowed."""
    kind = pick(draw, TEMPLATE_KINDS, dirty)
    if kind == "long":
        return draw(UNITS) * pick(draw, TEMPLATE_CHARS, dirty)
    if kind == "bomb" and bomb:
        return "{{inputs.big}}" * pick(draw, BOMBS, dirty)
    pieces = [draw(WORDS)]
    for _ in range(draw(UP_TO_3)):
        if refs and draw(COIN):
            pieces.append(draw(SPACED) % one_of_list(draw, refs))
        else:
            pieces.append(draw(DIRTY_PIECES if dirty else WORDS))
    return "".join(pieces)


def reference_bodies(
    node: int, ids: list[str], deps: list[list[str]], inputs: dict[str, str], dirty: int
) -> list[str]:
    """What node `node` may reference: known short inputs and its ancestors; when dirty, also
    unknown inputs, itself, later nodes and nodes that are not there."""
    names = [f"inputs.{name}" for name in inputs if name != "big"]
    reachable, stack = set(), list(deps[node])
    while stack:
        parent = stack.pop()
        if parent not in reachable and parent in ids:
            reachable.add(parent)
            stack.extend(deps[ids.index(parent)])
    names += [f"{parent}.output" for parent in sorted(reachable)]
    if dirty:
        names += ["inputs.ghost", "ghost.output", *(f"{other}.output" for other in ids)]
    return names


def draw_node(
    draw: st.DrawFn, node_id: str, refs: list[str], bomb: bool, dirty: int
) -> pb.NodeSpec:
    """A node with its own name and prompt: a template, chat messages or (dirty) none at all."""
    node = pb.NodeSpec(id=node_id, name=pick(draw, NAMES, dirty))
    kind = pick(draw, PROMPT_KINDS, dirty)
    if kind == "template":
        node.prompt_template = draw_template(draw, refs, bomb, dirty)
    elif kind == "chat":
        count = pick(draw, MESSAGE_COUNTS, dirty)
        for k in range(count):
            content = draw_template(draw, refs, bomb, dirty) if k < 3 else "hi"
            node.chat.messages.add(role=pick(draw, ROLES, dirty), content=content)
    return node


def big_nodes(ids: list[str], deps: list[list[str]]) -> list[pb.NodeSpec]:
    """Many nodes, drawn from nothing: each prompt uses up to two of the node's parents."""
    nodes = []
    for node_id, parents in zip(ids, deps, strict=True):
        prompt = " ".join(f"{{{{{p}.output}}}}" for p in parents[:2]) + " go"
        nodes.append(pb.NodeSpec(id=node_id, prompt_template=prompt))
    return nodes


@st.composite
def job_specs(draw: st.DrawFn) -> pb.JobSpec:
    dirty = draw(DIRT)
    inputs = draw_inputs(draw, dirty)
    ids, deps = draw_graph(draw, dirty)
    sampling = draw_sampling(draw, dirty)
    if len(ids) <= SMALL_JOB:
        bomb = "big" in inputs
        refs = [reference_bodies(i, ids, deps, inputs, dirty) for i in range(len(ids))]
        nodes = [draw_node(draw, i, r, bomb, dirty) for i, r in zip(ids, refs, strict=True)]
    else:
        nodes = big_nodes(ids, deps)
    for node, parents in zip(nodes, deps, strict=True):
        node.depends_on.extend(parents)
    for node in nodes[:SMALL_JOB]:  # one sampling per job, on some nodes: cheap to draw
        if draw(COIN):
            node.sampling.CopyFrom(sampling)
    spec = pb.JobSpec(
        nodes=nodes,
        inputs=inputs,
        name=pick(draw, NAMES, dirty),
        idempotency_key=pick(draw, KEYS, dirty),
        priority=pick(draw, PRIORITIES, dirty),
    )
    deadline = pick(draw, DEADLINES, dirty)
    if deadline is not None:
        spec.deadline.seconds, spec.deadline.nanos = deadline
    return spec


@st.composite
def generate_requests(draw: st.DrawFn) -> pb.GenerateRequest:
    dirty = draw(DIRT)
    request = pb.GenerateRequest(sampling=draw_sampling(draw, dirty), name=pick(draw, NAMES, dirty))
    kind = draw(GENERATE_KINDS)
    if kind == "words":
        request.prompt = draw(WORDS) + "{{inputs.x}}"  # a prompt is literal: no templates
    elif kind == "long":
        request.prompt = draw(UNITS) * pick(draw, INPUT_CHARS, dirty)
    else:
        for _ in range(max(draw(UP_TO_3), 1 - dirty)):  # a clean chat has a message
            request.chat.messages.add(role=pick(draw, ROLES, dirty), content=draw(WORDS))
    return request
