"""The `local` backend: the engine in this process, behind the `Backend` interface.

Its capacity is the engine's own (which counts the predicted output of requests it has not
admitted yet, and requests added while a step is in flight), so a snapshot taken right after a
submit already counts it. It is always healthy to the router: a failing step fails its own
calls, and only new calls let the engine show that it serves again (health is reported to
clients by the gRPC health service, from `AsyncEngine.healthy`). Calls are never lost here: the
engine fails them itself. Its knee is the one the engine measures from its own steps.
"""

from __future__ import annotations

from engine import AsyncEngine, Capacity, RequestStream, TokenDelta
from gateway.backends.base import (
    BackendCall,
    BackendCapacity,
    CallStream,
    CallUsage,
    Capabilities,
)


def engine_capacity(
    cap: Capacity, block_size: int, total_blocks: int = 0, knee_calls: int | None = None
) -> BackendCapacity:
    return BackendCapacity(
        cap.free_blocks,
        block_size,
        cap.free_seqs,
        cap.num_running,
        cap.num_waiting,
        True,
        total_blocks,
        knee_calls,
    )


class LocalBackend:
    def __init__(self, engine: AsyncEngine, model: str, name: str = "local") -> None:
        self.engine = engine
        self.name = name
        self.model = model
        hidden = engine.core.runner.hidden_size > 0
        self.capabilities = Capabilities(hidden_states=hidden, priority=True)
        self._blocks = engine.core.block_manager

    def capacity(self) -> BackendCapacity:
        return engine_capacity(
            self.engine.capacity,
            self._blocks.block_size,
            self._blocks.num_blocks,
            self.engine.step_fit.knee,
        )

    def down_for(self) -> float | None:
        """None: it always takes calls (a failing step fails its own)."""
        return None

    def submit(self, call: BackendCall) -> CallStream:
        stream = self.engine.add_request(
            call.prompt_ids,
            call.params,
            request_id=call.call_id,
            priority=call.priority,
            predicted_output_len=call.predicted_output,
            cache_salt=call.cache_salt,
        )
        return _LocalStream(stream, len(call.prompt_ids))

    def abort(self, call_id: str) -> None:
        self.engine.abort(call_id)

    def set_priority(self, call_id: str, priority: float) -> None:
        self.engine.set_priority(call_id, priority)

    def set_prediction(self, call_id: str, predicted_output: int) -> None:
        self.engine.set_prediction(call_id, predicted_output)


class _LocalStream:
    """The engine's stream of a request, counting what it streamed: the engine's own count."""

    def __init__(self, stream: RequestStream, prompt_tokens: int) -> None:
        self._stream = stream
        self._prompt_tokens = prompt_tokens
        self._produced = 0
        self.usage: CallUsage | None = None

    def __aiter__(self) -> _LocalStream:
        return self

    async def __anext__(self) -> TokenDelta:
        delta = await self._stream.__anext__()
        self._produced += len(delta.token_ids)
        if delta.finished:
            self.usage = CallUsage(self._prompt_tokens, self._produced, reported=True)
        return delta

    async def aclose(self) -> None:
        await self._stream.aclose()
