"""fairgate's inference engine: paged KV, continuous batching, prediction-aware admission.

`LLMEngine` steps a `Scheduler` (a `StepPlan` each step, over the `BlockManager`'s paged KV and
prefix cache) through a `Runner` (the model, or `SimulatedRunner` with a `StepTimeModel`);
`AsyncEngine` owns its step loop for async callers and streams `TokenDelta`s. A request is a
prompt's token ids with `SamplingParams`; `EngineConfig` holds the sizes and the `ReserveMode`.
Usable alone: it imports nothing from the gateway, tenants or predictor packages, and its HTTP
face (`engine.openai_api`) is imported only when asked for (docs/ARCHITECTURE.md §9).
"""

from engine.async_engine import AsyncEngine, RequestStream, TokenDelta
from engine.block_manager import BlockManager
from engine.config import EngineConfig, ReserveMode
from engine.errors import (
    DuplicateRequest,
    EngineClosed,
    EngineError,
    InvalidRequest,
    RequestNotFound,
)
from engine.llm import LLMEngine, RequestOutput, Runner
from engine.plan import ScheduledSeq, StepOutput, StepPlan
from engine.request import FinishReason, Request, RequestStatus
from engine.sampling import MAX_TEMPERATURE, MIN_TEMPERATURE, SamplingParams
from engine.scheduler import Capacity, Scheduler, StepResult
from engine.sim_runner import SimulatedRunner, StepShape, StepTimeModel, prefill_pairs

__all__ = [
    "MAX_TEMPERATURE",
    "MIN_TEMPERATURE",
    "AsyncEngine",
    "BlockManager",
    "Capacity",
    "DuplicateRequest",
    "EngineClosed",
    "EngineConfig",
    "EngineError",
    "FinishReason",
    "InvalidRequest",
    "LLMEngine",
    "Request",
    "RequestNotFound",
    "RequestOutput",
    "RequestStatus",
    "RequestStream",
    "ReserveMode",
    "Runner",
    "SamplingParams",
    "ScheduledSeq",
    "Scheduler",
    "SimulatedRunner",
    "StepOutput",
    "StepPlan",
    "StepResult",
    "StepShape",
    "StepTimeModel",
    "TokenDelta",
    "prefill_pairs",
]
