"""fairgate's predictor: what a call will cost, how sure we are, and when a prompt is an attack.

Imports nothing from the gateway or tenants packages; the engine only for its step-time model.
"""

from predictor.anomaly import AnomalyGuard, Assessment, GuardConfig
from predictor.base import CallFeatures, LengthPredictor
from predictor.cost import (
    CostNode,
    JobCost,
    NodeCost,
    TokenCounters,
    job_cost,
    kv_token_time,
)
from predictor.distribution import LengthDistribution
from predictor.error_tracker import ErrorStats, ErrorTracker
from predictor.errors import (
    ArtifactInvalid,
    ArtifactMissing,
    InvalidCall,
    InvalidDistribution,
    JobGraphInvalid,
    LabelsInvalid,
    NotEnoughData,
    PredictorError,
    PromptsMissing,
    QuantileOutOfRange,
)
from predictor.history import HistoryPredictor, LengthProfile
from predictor.labels import LabelRow, is_held_out, read_labels, write_labels
from predictor.latency import DecodingCall, EngineState, Estimate, LatencyModel, QueuedCall
from predictor.prompt_model import DEFAULT_ARTIFACT, PromptModel

__all__ = [
    "DEFAULT_ARTIFACT",
    "AnomalyGuard",
    "ArtifactInvalid",
    "ArtifactMissing",
    "Assessment",
    "CallFeatures",
    "CostNode",
    "DecodingCall",
    "EngineState",
    "ErrorStats",
    "ErrorTracker",
    "Estimate",
    "GuardConfig",
    "HistoryPredictor",
    "InvalidCall",
    "InvalidDistribution",
    "JobCost",
    "JobGraphInvalid",
    "LabelRow",
    "LabelsInvalid",
    "LatencyModel",
    "LengthDistribution",
    "LengthPredictor",
    "LengthProfile",
    "NodeCost",
    "NotEnoughData",
    "PredictorError",
    "PromptModel",
    "PromptsMissing",
    "QuantileOutOfRange",
    "QueuedCall",
    "TokenCounters",
    "is_held_out",
    "job_cost",
    "kv_token_time",
    "read_labels",
    "write_labels",
]
