from __future__ import annotations

import pytest

from gateway.jobs.errors import TemplateUnresolved
from gateway.jobs.model import ChatMessage, NodeSpec
from gateway.jobs.template import (
    Reference,
    RefKind,
    malformed_placeholders,
    references,
    render,
    render_messages,
    render_node,
    rendered_chars,
)
from tests.gateway.jobs.factories import make_chat_node, make_node

INPUTS = {"x": "12345", "topic": "owls", "empty": "", "braces": "{{inputs.x}}"}
OUTPUTS = {"a": "draft one", "b-2": "", "c_3": "🦉" * 3 + "\u202eRTL"}


def test_references_in_order_with_whitespace() -> None:
    template = "Q: {{inputs.question}}\nA: {{ draft-1.output }} / {{\tinputs.q_2 }}"
    assert references(template) == [
        Reference(RefKind.INPUT, "question", "{{inputs.question}}"),
        Reference(RefKind.OUTPUT, "draft-1", "{{ draft-1.output }}"),
        Reference(RefKind.INPUT, "q_2", "{{\tinputs.q_2 }}"),
    ]


@pytest.mark.parametrize(
    "placeholder",
    ["{{ name }}", "{{a.text}}", "{{inputs.}}", "{{inputs.x.y}}", "{{}}", "{{ 1a.output }}"],
)
def test_malformed_placeholders(placeholder: str) -> None:
    template = f"before {placeholder} after {{{{inputs.ok}}}}"
    assert malformed_placeholders(template) == [placeholder]
    assert [ref.name for ref in references(template)] == ["ok"]


def test_text_without_placeholders_is_left_alone() -> None:
    text = 'JSON {"a": {"b": 1}} and {single} braces and }} {{ unclosed'
    assert references(text) == []
    assert malformed_placeholders(text) == []
    assert render(text, {}, {}) == text


def test_render_substitutes_every_reference() -> None:
    template = "{{inputs.topic}}: {{ a.output }} + {{b.output}} ({{inputs.topic}})"
    rendered = render(template, {"topic": "cats"}, {"a": "one", "b": "two"})
    assert rendered == "cats: one + two (cats)"


def test_inserted_text_is_not_scanned_again() -> None:
    rendered = render("{{inputs.x}}|{{a.output}}", {"x": "{{inputs.y}}"}, {"a": "{{a.output}}"})
    assert rendered == "{{inputs.y}}|{{a.output}}"


def test_extra_braces_stay_literal() -> None:
    assert render("{{{inputs.x}}}", {"x": "v"}, {}) == "{v}"


@pytest.mark.parametrize(
    ("template", "placeholder"),
    [
        ("hi {{inputs.missing}}", "{{inputs.missing}}"),
        ("hi {{ ghost.output }}", "{{ ghost.output }}"),
        ("hi {{ nonsense }}", "{{ nonsense }}"),
    ],
)
def test_render_refuses_unresolved_placeholders(template: str, placeholder: str) -> None:
    with pytest.raises(TemplateUnresolved) as caught:
        render(template, {"present": "x"}, {"present": "y"})
    assert caught.value.placeholder == placeholder


def test_inputs_and_outputs_do_not_mix() -> None:
    with pytest.raises(TemplateUnresolved):
        render("{{inputs.a}}", {}, {"a": "output of a"})
    with pytest.raises(TemplateUnresolved):
        render("{{a.output}}", {"a": "input a"}, {})


def test_render_messages_keeps_roles() -> None:
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "{{ s.output }}?")]
    assert render_messages(messages, {}, {"s": "why"}) == (
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "why?"),
    )


def test_render_node_text_and_chat() -> None:
    text_node = make_node("b", "Improve: {{a.output}}", depends_on=("a",))
    assert render_node(text_node, {}, {"a": "draft"}) == "Improve: draft"
    chat_node = make_chat_node("c", ("user", "About {{inputs.t}}"))
    assert render_node(chat_node, {"t": "owls"}, {}) == (ChatMessage("user", "About owls"),)


def rendered_length(node: NodeSpec) -> int:
    rendered = render_node(node, INPUTS, OUTPUTS)
    if isinstance(rendered, str):
        return len(rendered)
    return sum(len(message.content) for message in rendered)


def sizes(values: dict[str, str]) -> dict[str, int]:
    return {name: len(value) for name, value in values.items()}


@pytest.mark.parametrize(
    "template",
    [
        "plain text",
        "{{inputs.x}}",
        "{{ inputs.x }}{{\tinputs.topic\n}}",
        "{{inputs.x}}" * 400,
        "a {{a.output}} b {{ b-2.output }} c {{c_3.output}} {{inputs.empty}}",
        "{{{inputs.x}}}",
        'JSON {"a": {"b": 1}} }} {{ unclosed {{inputs.braces}}',
        "{{inputs.topic}}{{inputs.topic}}{{a.output}}{{inputs.topic}}",
        "🦉\u202e\x00 {{inputs.topic}} \U0001f600",
    ],
)
def test_rendered_chars_is_the_rendered_length(template: str) -> None:
    node = make_node("n", template)
    assert rendered_chars(node, sizes(INPUTS), sizes(OUTPUTS)) == rendered_length(node)


def test_rendered_chars_of_chat_sums_the_messages() -> None:
    node = make_chat_node(
        "c",
        ("system", "Be brief about {{ inputs.topic }}."),
        ("user", "{{a.output}}?"),
        ("user", ""),
    )
    assert rendered_chars(node, sizes(INPUTS), sizes(OUTPUTS)) == rendered_length(node)


def test_rendered_chars_counts_unknown_and_malformed_as_empty() -> None:
    node = make_node("n", "ab{{inputs.ghost}}cd{{ nonsense }}ef{{z.output}}")
    assert rendered_chars(node, {}, {}) == len("abcdef")


def test_rendered_chars_reads_only_sizes() -> None:
    bomb = make_node("n", "{{inputs.x}}" * 400 + "{{a.output}}")
    assert rendered_chars(bomb, {"x": 125_000}, {"a": 7}) == 400 * 125_000 + 7
