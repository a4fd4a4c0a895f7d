"""The completions wire format without a server: defaults, vLLM's spellings and refusals."""

from __future__ import annotations

import json

import pytest

from engine.errors import InvalidRequest
from engine.openai_api.errors import BadRequest
from engine.openai_api.protocol import (
    DEFAULT_MAX_TOKENS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    Choice,
    Completion,
    parse_request,
    sse,
)


def parse(**fields: object) -> object:
    return parse_request(json.dumps({"prompt": [1, 2, 3], **fields}).encode())


def test_defaults_are_openais() -> None:
    params = parse_request(b'{"prompt": "hi"}').sampling_params(prompt_len=2, max_model_len=100)
    assert params.max_tokens == DEFAULT_MAX_TOKENS
    assert (params.temperature, params.top_p, params.top_k, params.min_tokens) == (1.0, 1.0, 0, 0)


def test_vllm_fields_reach_the_engines_parameters() -> None:
    request = parse_request(
        json.dumps(
            {
                "prompt": [1],
                "max_tokens": 9,
                "min_tokens": 3,
                "top_k": -1,
                "stop": "\n",
                "stop_token_ids": [7],
                "ignore_eos": True,
                "seed": 5,
                "temperature": 0,
            }
        ).encode()
    )
    params = request.sampling_params(prompt_len=1, max_model_len=100)
    assert (params.max_tokens, params.min_tokens, params.top_k) == (9, 3, 0)
    assert (params.stop, params.stop_token_ids, params.ignore_eos) == (("\n",), (7,), True)
    assert (params.seed, params.greedy) == (5, True)


def test_max_tokens_is_capped_and_min_tokens_must_fit_under_the_cap() -> None:
    request = parse_request(b'{"prompt": [1], "max_tokens": 50, "min_tokens": 10}')
    assert request.sampling_params(prompt_len=90, max_model_len=100).max_tokens == 10
    with pytest.raises(InvalidRequest, match="min_tokens"):
        request.sampling_params(prompt_len=95, max_model_len=100)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 3}, "n"),
        ({"echo": True}, "echo"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop"),
        # millions of ids in one body would slow every other request's steps
        ({"stop_token_ids": [7] * (MAX_STOP_TOKEN_IDS + 1)}, "stop_token_ids"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [[1], [2]]}, "prompt"),
        ({"prompt": [[1, "a"]]}, "prompt"),
        ({"prompt": [1, True]}, "prompt"),
        (
            {"stream": True, "stream_options": {"continuous_usage_stats": True}},
            "stream_options.continuous_usage_stats",
        ),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"seed": -1}, "seed"),
        ({"priority": 1 << 70}, "priority"),
    ],
)
def test_refusals_name_the_field(fields: dict[str, object], param: str) -> None:
    with pytest.raises(BadRequest) as refused:
        parse(**fields)
    assert refused.value.param == param


def test_what_vllm_accepts_of_what_the_engine_refuses_is_mapped_as_vllm_maps_it() -> None:
    """A batch of one prompt is that prompt; a temperature under the engine's least (which it
    refuses: logits divided by it overflow) is raised to it, as vLLM raises it, not a 400."""
    assert parse_request(b'{"prompt": ["hi"]}').prompt == "hi"
    assert parse_request(b'{"prompt": [[5, 6]]}').prompt == [5, 6]
    tiny = parse(temperature=0.001).sampling_params(prompt_len=3, max_model_len=100)
    assert tiny.temperature == 0.01 and not tiny.greedy
    with pytest.raises(InvalidRequest, match="temperature"):
        parse(temperature=-0.5).sampling_params(prompt_len=3, max_model_len=100)


def test_fields_asking_for_nothing_and_unknown_fields_are_accepted() -> None:
    parse(n=1, echo=False, logprobs=None, presence_penalty=0, user="someone", future_field=1)


def test_an_event_whose_text_holds_unicode_line_separators_is_one_line_for_any_client() -> None:
    text = "a\x85b\u2028c\u2029d"
    event = sse(Completion(id="cmpl-1", created=0, model="m", choices=[Choice(text=text)]))
    (line, blank) = event.splitlines()  # as httpx's aiter_lines splits it: the event, its end
    assert blank == "" and json.loads(line.removeprefix("data: "))["choices"][0]["text"] == text
