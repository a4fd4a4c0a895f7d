"""The job model: immutable plain-data twins of the JobSpec and NodeSpec protos.

A job is a DAG of LLM calls. Each node carries a prompt — one template, or chat messages whose
contents are templates — the ids it depends on, and optional sampling settings (None means
"the server decides": tenant default or engine default). Invariant: these objects are what the
client sent, converted but not checked; `validation.validate_job` decides whether they are
acceptable, and nothing here reads the clock or does I/O.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

CHAT_ROLES = ("system", "user", "assistant")


NODE_BYTES = 600  # a node's objects besides its strings: its spec, sampling and tuples


@dataclass(frozen=True, slots=True)
class SamplingSpec:
    """A node's requested sampling; None fields are filled by the server."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str  # a template inside a job


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One call. Exactly one of prompt_template and messages should be set."""

    id: str
    prompt_template: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    depends_on: tuple[str, ...] = ()
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    name: str = ""  # the kind of call, for length history
    model: str = ""  # the served model it runs on; empty: the gateway's default

    def templates(self) -> Iterator[tuple[str, str]]:
        """(field path relative to the node, template) for every template the node holds."""
        if self.prompt_template is not None:
            yield "prompt_template", self.prompt_template
        for index, message in enumerate(self.messages or ()):
            yield f"chat.messages[{index}].content", message.content


@dataclass(frozen=True, slots=True)
class JobSpec:
    nodes: tuple[NodeSpec, ...]
    inputs: Mapping[str, str] = field(default_factory=dict)
    idempotency_key: str = ""
    priority: int = 0
    deadline_unix_s: float | None = None  # absolute, seconds since the epoch (UTC)
    name: str = ""

    @property
    def sheddable(self) -> bool:
        """A negative priority: under overload its calls give way to the others'."""
        return self.priority < 0

    def held_bytes(self) -> int:
        """About the memory holding the spec takes: each of its strings as Python holds it (a
        character of a wide script takes up to 4 bytes), and its objects."""
        strings = [self.idempotency_key, self.name, *self.inputs.keys(), *self.inputs.values()]
        for node in self.nodes:
            strings += [node.id, node.name, node.model, *node.depends_on, *node.sampling.stop]
            strings += [template for _, template in node.templates()]
            strings += [message.role for message in node.messages or ()]
        return len(self.nodes) * NODE_BYTES + sum(map(sys.getsizeof, strings))
