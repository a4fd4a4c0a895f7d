"""Fitting a traced call into the serving model's context window.

Traces count tokens in their upstream model's tokenizer and window; the study's engine has a
context of `context` tokens. A call keeps its output length up to `max_tokens_cap(context)` (half
the window), its prompt (already scaled by the caller) is clipped to leave room for that output,
and its max_tokens is the cap or what the window leaves, whichever is smaller. Invariant:
`1 <= prompt`, `1 <= output <= max_tokens`, `prompt + max_tokens <= context`.
"""

from __future__ import annotations


def max_tokens_cap(context: int) -> int:
    return context // 2


def fit_to_context(prompt: int, output: int, context: int) -> tuple[int, int, int]:
    """(prompt, output, max_tokens) of a call fitted into `context` tokens."""
    if context < 4:
        raise ValueError(f"context must be >= 4 tokens, got {context}")
    cap = max_tokens_cap(context)
    output = min(max(output, 1), cap)
    prompt = min(max(prompt, 1), context - output)
    return prompt, output, min(cap, context - prompt)
