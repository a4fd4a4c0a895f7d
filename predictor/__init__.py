"""fairgate's predictor: how long a call will run, how sure we are, and when a prompt is an attack.

What the server runs: `HistoryPredictor` (per tenant and node; with the trained `PromptModel`,
that model's answer corrected online per tenant and node by a `ResidualCorrection`, and falling
back toward the prior on unfamiliar prompts by its `Familiarity`) gives a call's
`LengthDistribution`; `ErrorTracker` watches how far predictions
miss; `AnomalyGuard` scores a prompt for unbounded consumption; `LatencyModel` estimates TTFT and
completion from the engine's state. The models' artifacts live in `predictor/artifacts/`; what
makes them (labels, training, evaluation) is offline work in `bench/prediction/`. Imports nothing
from the gateway or tenants packages; the engine only for its step-time model and request state.
"""

from predictor.anomaly import AnomalyGuard, Assessment, GuardConfig
from predictor.base import CallFeatures, LengthPredictor
from predictor.correction import ResidualCorrection
from predictor.distribution import LengthDistribution
from predictor.error_tracker import ErrorStats, ErrorTracker
from predictor.errors import (
    ArtifactInvalid,
    ArtifactMissing,
    InvalidCall,
    InvalidDistribution,
    PredictorError,
    QuantileOutOfRange,
)
from predictor.familiarity import Familiarity
from predictor.history import HistoryPredictor, LengthProfile
from predictor.latency import DecodingCall, EngineState, Estimate, LatencyModel, QueuedCall
from predictor.prompt_model import DEFAULT_ARTIFACT, PromptModel

__all__ = [
    "DEFAULT_ARTIFACT",
    "AnomalyGuard",
    "ArtifactInvalid",
    "ArtifactMissing",
    "Assessment",
    "CallFeatures",
    "DecodingCall",
    "EngineState",
    "ErrorStats",
    "ErrorTracker",
    "Estimate",
    "Familiarity",
    "GuardConfig",
    "HistoryPredictor",
    "InvalidCall",
    "InvalidDistribution",
    "LatencyModel",
    "LengthDistribution",
    "LengthPredictor",
    "LengthProfile",
    "PredictorError",
    "PromptModel",
    "QuantileOutOfRange",
    "QueuedCall",
    "ResidualCorrection",
]
