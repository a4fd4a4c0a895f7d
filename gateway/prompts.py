"""Turning a rendered node prompt into token ids with the serving model's chat template."""

from __future__ import annotations

from typing import Any

from gateway.jobs.model import ChatMessage


def encode_prompt(tokenizer: Any, prompt: str | tuple[ChatMessage, ...]) -> list[int]:
    """A plain prompt is one user turn; chat messages keep their roles."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = [{"role": m.role, "content": m.content} for m in prompt]
    encoded = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(encoded["input_ids"])


def prompt_text(prompt: str | tuple[ChatMessage, ...]) -> str:
    """The words of a prompt without the chat template (what length predictors read)."""
    return prompt if isinstance(prompt, str) else "\n".join(m.content for m in prompt)
