"""What every output-length predictor takes and returns.

A predictor maps the cheap facts about one call (who asks, which DAG node, the prompt's text
and token count, the enforced max_tokens) to a `LengthDistribution`. Online learners also
`observe` a finished call's true output length. Invariant: `predict` never reads the clock or
does I/O, and its answer never exceeds `call.max_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from predictor.distribution import LengthDistribution
from predictor.errors import InvalidCall


@dataclass(frozen=True, slots=True)
class CallFeatures:
    """One call as the predictors see it.

    `prompt_text` is the call's instruction as the user wrote it (messages' contents, without
    the chat template); `prompt_tokens` counts what the engine will prefill (template included).
    Text, not token ids, is carried because phrasing cues and word n-grams are read from it
    and it does not tie the predictor to one tokenizer.
    """

    tenant_id: str
    node_name: str
    prompt_tokens: int
    max_tokens: int
    prompt_text: str = ""
    model: str = ""  # the served model that will run it: lengths are the model's behaviour

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0:
            raise InvalidCall(f"prompt_tokens must be >= 0, got {self.prompt_tokens}")
        if self.max_tokens < 1:
            raise InvalidCall(f"max_tokens must be >= 1, got {self.max_tokens}")


class LengthPredictor(Protocol):
    def predict(self, call: CallFeatures) -> LengthDistribution:
        """The call's output-length distribution, capped at `call.max_tokens`."""
        ...

    def observe(self, call: CallFeatures, true_len: int) -> None:
        """Learn from a finished call; a static model ignores it."""
        ...
