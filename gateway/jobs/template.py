"""Prompt templates with `{{inputs.NAME}}` and `{{NODE_ID.output}}` placeholders.

Algorithm: one regular-expression pass finds every placeholder — `{{`, text without braces,
`}}` — and reads its body, whitespace trimmed, as `inputs.NAME` (a job input) or
`NODE_ID.output` (another node's generated text); any other body is malformed. Rendering
substitutes in that same single pass, so inserted text is never scanned again: an input or an
output that itself contains `{{x}}` stays literal. `rendered_chars` walks the same matches but
adds sizes instead of text, so a prompt's size is known before any of it is built. Invariant:
`render` returns only when every placeholder of the template is a reference with a value, and it
changes nothing else; for such a node, `rendered_chars` equals the length of what `render_node`
returns (the sum of the contents for chat).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.jobs.errors import TemplateUnresolved
from gateway.jobs.model import ChatMessage, NodeSpec

IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_-]*"  # node ids and input names
_PLACEHOLDER = re.compile(r"\{\{([^{}]*)\}\}")
_REFERENCE = re.compile(
    rf"\s*(?:inputs\.(?P<input>{IDENTIFIER})|(?P<node>{IDENTIFIER})\.output)\s*"
)


class RefKind(enum.Enum):
    INPUT = "input"
    OUTPUT = "output"


@dataclass(frozen=True, slots=True)
class Reference:
    kind: RefKind
    name: str  # the input name or the node id
    placeholder: str  # as written, e.g. "{{ map_1.output }}"


def _parse(match: re.Match[str]) -> Reference | None:
    body = _REFERENCE.fullmatch(match.group(1))
    if body is None:
        return None
    if body.group("input") is not None:
        return Reference(RefKind.INPUT, body.group("input"), match.group(0))
    return Reference(RefKind.OUTPUT, body.group("node"), match.group(0))


def references(template: str) -> list[Reference]:
    """The well-formed placeholders of the template, in order of appearance."""
    found = (_parse(match) for match in _PLACEHOLDER.finditer(template))
    return [ref for ref in found if ref is not None]


def malformed_placeholders(template: str) -> list[str]:
    """Placeholders that are neither `{{inputs.NAME}}` nor `{{NODE_ID.output}}`."""
    return [m.group(0) for m in _PLACEHOLDER.finditer(template) if _parse(m) is None]


def render(template: str, inputs: Mapping[str, str], outputs: Mapping[str, str]) -> str:
    """Replace every placeholder; raises TemplateUnresolved on the first one without a value."""

    def substitute(match: re.Match[str]) -> str:
        ref = _parse(match)
        values = inputs if ref is not None and ref.kind is RefKind.INPUT else outputs
        if ref is None or ref.name not in values:
            raise TemplateUnresolved(match.group(0))
        return values[ref.name]

    return _PLACEHOLDER.sub(substitute, template)


def render_messages(
    messages: Sequence[ChatMessage], inputs: Mapping[str, str], outputs: Mapping[str, str]
) -> tuple[ChatMessage, ...]:
    return tuple(ChatMessage(m.role, render(m.content, inputs, outputs)) for m in messages)


def render_node(
    node: NodeSpec, inputs: Mapping[str, str], outputs: Mapping[str, str]
) -> str | tuple[ChatMessage, ...]:
    """The node's prompt with references filled: text, or chat messages for a chat node.

    `outputs` maps node ids to their generated text; the node must have passed validate_job.
    """
    if node.prompt_template is not None:
        return render(node.prompt_template, inputs, outputs)
    assert node.messages is not None, "validate_job guarantees a prompt"
    return render_messages(node.messages, inputs, outputs)


def _template_chars(
    template: str, input_chars: Mapping[str, int], output_chars: Mapping[str, int]
) -> int:
    """The length `render` would return, in one pass and without building the text.

    A placeholder `render` would refuse (malformed, or naming an unknown value) counts 0: a
    size check must not fail on a template that validation reports for its own reasons.
    """
    total = len(template)
    for match in _PLACEHOLDER.finditer(template):
        total -= match.end() - match.start()
        ref = _parse(match)
        if ref is not None:
            sizes = input_chars if ref.kind is RefKind.INPUT else output_chars
            total += sizes.get(ref.name, 0)
    return total


def rendered_chars(
    node: NodeSpec, input_chars: Mapping[str, int], output_chars: Mapping[str, int]
) -> int:
    """The characters of the node's rendered prompt (all its templates), from value sizes alone.

    A job of a few kilobytes can repeat one large input into a prompt of many megabytes; this
    bounds that before `render_node` spends the memory. O(total template length).
    """
    return sum(_template_chars(t, input_chars, output_chars) for _, t in node.templates())
