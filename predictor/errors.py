"""Predictor failures, named for the state that stops a prediction or a model's loading."""


class PredictorError(Exception):
    """Base class of the predictor errors."""


class InvalidCall(PredictorError, ValueError):
    """A call's features are out of range (negative token counts, max_tokens below 1)."""


class InvalidDistribution(PredictorError, ValueError):
    """Length quantiles are negative or not in increasing order."""


class ArtifactMissing(PredictorError, FileNotFoundError):
    """The trained model file is absent: train it or pass another path."""


class ArtifactInvalid(PredictorError):
    """The trained model file is corrupt or was written by an incompatible version."""


class QuantileOutOfRange(PredictorError, ValueError):
    """A quantile level outside [0, 1] was asked for."""
