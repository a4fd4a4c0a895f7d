"""The OpenAI completions wire format as vLLM serves it: request validation and response shapes.

Pure (no I/O), so every rule is testable without a server. A request is one prompt, a string or a
list of token ids (or a batch of one of them); OpenAI's fields and vLLM's extensions are accepted
where fairgate's engine implements them (top_k, min_tokens, ignore_eos, stop_token_ids, priority,
request_id, cache_salt, return_token_ids), under vLLM's names so one client works against both
servers. A field the engine does not implement (n > 1, logprobs, echo, penalties, ...) is refused
with a 400 naming it rather than silently ignored; fields nobody defined are ignored, as OpenAI
and vLLM do. Where vLLM maps what the engine refuses, so does this: a positive temperature under
the engine's least is raised to it.
Invariant: a request that validated, with a prompt that passed `check_prompt`, maps to
`SamplingParams` whose max_tokens fits the context (max_model_len - prompt), or the mapping raises
the engine's InvalidRequest, which the edge answers with 400 like every other refusal here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from engine.openai_api.errors import BadRequest
from engine.request import FinishReason, Request
from engine.sampling import MIN_TEMPERATURE, SEED_LIMIT, SamplingParams

DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for completions
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default: sampling, not greedy
MAX_STOP_STRINGS = 16  # each is searched for after every token
MAX_STOP_CHARS = 512
MAX_STOP_TOKEN_IDS = 64  # each generated token is looked up in them, inside the shared step
INT64 = 1 << 63
M = TypeVar("M", bound=BaseModel)


def _only(*allowed: object) -> AfterValidator:
    """A field OpenAI or vLLM define that fairgate's engine does not implement: accepted at the
    values that ask for nothing (clients send those as defaults), else refused naming it."""

    def check(value: Any, info: ValidationInfo) -> Any:
        if value not in allowed:
            # not a ValueError: pydantic lets it through as it is, naming its field
            raise BadRequest(f"{info.field_name}: not supported by this server", info.field_name)
        return value

    return AfterValidator(check)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    include_usage: bool = False  # a last chunk with the usage, before [DONE]
    continuous_usage_stats: Literal[False] = False  # usage on every chunk: not served


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    model: str | None = None  # when given, it must name the served model
    prompt: str | list[int]
    max_tokens: int | None = Field(default=None, ge=1)  # capped to max_model_len - prompt
    min_tokens: int = Field(default=0, ge=0)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = Field(default=None, ge=-1)  # 0 or -1 (vLLM's spelling): off
    seed: int | None = Field(default=None, ge=0, lt=SEED_LIMIT)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = False
    priority: int = Field(default=0, ge=-INT64, lt=INT64)  # lower is served first
    request_id: str | None = Field(default=None, min_length=1, max_length=256)
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False  # vLLM: token_ids per choice, prompt_token_ids once
    # what the engine does not implement, each a field of its own (`_only`): a validator of the
    # whole model would have every field of the body turned into Python objects first, those
    # nobody defined included (a 16 MB body of them took 2.5 s of the event loop and 530 MB),
    # where undeclared fields are skipped
    n: Annotated[Any, _only(None, 1)] = None
    best_of: Annotated[Any, _only(None, 1)] = None
    echo: Annotated[Any, _only(None, False)] = None
    suffix: Annotated[Any, _only(None)] = None
    logprobs: Annotated[Any, _only(None)] = None
    prompt_logprobs: Annotated[Any, _only(None)] = None
    logit_bias: Annotated[Any, _only(None, {})] = None
    presence_penalty: Annotated[Any, _only(None, 0)] = None
    frequency_penalty: Annotated[Any, _only(None, 0)] = None
    repetition_penalty: Annotated[Any, _only(None, 1)] = None
    min_p: Annotated[Any, _only(None, 0)] = None
    use_beam_search: Annotated[Any, _only(None, False)] = None
    include_stop_str_in_output: Annotated[Any, _only(None, False)] = None
    skip_special_tokens: Annotated[Any, _only(None, True)] = None
    add_special_tokens: Annotated[Any, _only(None, True)] = None
    truncate_prompt_tokens: Annotated[Any, _only(None)] = None
    allowed_token_ids: Annotated[Any, _only(None)] = None
    bad_words: Annotated[Any, _only(None, [])] = None
    prompt_embeds: Annotated[Any, _only(None)] = None
    response_format: Annotated[Any, _only(None)] = None
    structured_outputs: Annotated[Any, _only(None)] = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        # a batch of one (vLLM takes lists of prompts) is its prompt
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
            value = value[0]
        if isinstance(value, str) or (
            isinstance(value, list) and all(type(t) is int for t in value)
        ):
            return value
        raise PydanticCustomError(
            "prompt", "must be a string or a list of token ids (one prompt per request)"
        )

    @field_validator("stop")
    @classmethod
    def _bounded_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP_STRINGS:
            raise PydanticCustomError("stop", "at most {n} stop strings", {"n": MAX_STOP_STRINGS})
        if any(not 0 < len(s) <= MAX_STOP_CHARS for s in stops):
            raise PydanticCustomError(
                "stop", "stop strings must have 1 to {n} characters", {"n": MAX_STOP_CHARS}
            )
        return value

    @model_validator(mode="after")
    def _stream_options_need_a_stream(self) -> CompletionRequest:
        if self.stream_options is not None and not self.stream:
            raise BadRequest("stream_options: needs stream: true", "stream_options")
        return self

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling_params(self, prompt_len: int, max_model_len: int) -> SamplingParams:
        """The engine's parameters, max_tokens capped to what the context leaves."""
        requested = DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens
        return SamplingParams(
            max_tokens=min(requested, max_model_len - prompt_len),
            min_tokens=self.min_tokens,
            temperature=_temperature(self.temperature),
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=max(self.top_k or 0, 0),
            seed=self.seed,
            stop=(self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ()),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
        )


def _temperature(asked: float | None) -> float:
    """The engine's temperature: a positive one under its least is raised to it, as vLLM does
    (dividing logits by less overflows them); others are the engine's to accept or refuse."""
    if asked is None:
        return DEFAULT_TEMPERATURE
    return MIN_TEMPERATURE if 0.0 < asked < MIN_TEMPERATURE else asked


def parse_request(body: bytes) -> CompletionRequest:
    """Validate a JSON body; a refusal names the first field at fault."""
    return _parse(CompletionRequest, body)


def _parse(model: type[M], body: bytes) -> M:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        param = ".".join(str(part) for part in error["loc"]) or None
        message = error["msg"] if param is None else f"{param}: {error['msg']}"
        raise BadRequest(message, param) from None


def check_prompt(token_ids: Sequence[int], vocab_size: int, max_model_len: int) -> None:
    """Refuse a prompt that is empty, leaves no room for output or is out of vocabulary (its
    length first: a prompt far too long is refused before its ids are scanned)."""
    if not token_ids:
        raise BadRequest("the prompt is empty", "prompt")
    if len(token_ids) >= max_model_len:
        raise BadRequest(
            f"the prompt has {len(token_ids)} tokens; max_model_len {max_model_len} leaves no "
            "room for output",
            "prompt",
        )
    if min(token_ids) < 0 or max(token_ids) >= vocab_size:
        raise BadRequest(f"prompt token ids must be in [0, {vocab_size})", "prompt")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, request: Request) -> Usage:
        """The usage the engine counted for a finished request."""
        prompt, output = request.num_prompt_tokens, request.num_output_tokens
        return cls(prompt_tokens=prompt, completion_tokens=output, total_tokens=prompt + output)


class Choice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None
    token_ids: list[int] | None = None  # with return_token_ids: this chunk's generated tokens
    prompt_token_ids: list[int] | None = None  # with return_token_ids: once (the first chunk)


class Completion(BaseModel):
    """A whole completion, or one chunk of a stream (no choice, only usage, on the last)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None


def finish_reason(reason: FinishReason | None) -> Literal["stop", "length"] | None:
    if reason is FinishReason.STOP:
        return "stop"
    if reason is FinishReason.LENGTH:
        return "length"
    return None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "fairgate"
    root: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeRequest(BaseModel):
    """vLLM's POST /tokenize for a text prompt (its chat-messages form is not served)."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    model: str | None = None  # when given, it must name the served model
    prompt: str
    add_special_tokens: bool = True  # as a completion's string prompt is encoded
    return_token_strs: bool = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


def parse_tokenize(body: bytes) -> TokenizeRequest:
    return _parse(TokenizeRequest, body)


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None
    code: int  # the HTTP status, as vLLM sets it


class ErrorBody(BaseModel):
    error: ErrorInfo

    @classmethod
    def of(cls, message: str, type: str, status: int, param: str | None = None) -> ErrorBody:
        return cls(error=ErrorInfo(message=message, type=type, param=param, code=status))


# Legal unescaped in a JSON string, but a client that splits the stream with `str.splitlines`
# (httpx's `aiter_lines` does) ends a line at each and cuts the event in two; escaped, the JSON
# means the same and every client reads the event whole. Only strings can hold them.
_LINE_BREAKERS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse(event: BaseModel) -> str:
    """One server-sent event carrying `event` as JSON."""
    return f"data: {event.model_dump_json().translate(_LINE_BREAKERS)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
