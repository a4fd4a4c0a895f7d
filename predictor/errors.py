"""Predictor failures, named for the state that stops a prediction or a training run."""


class PredictorError(Exception):
    """Base class of the predictor errors."""


class InvalidCall(PredictorError, ValueError):
    """A call's features are out of range (negative token counts, max_tokens below 1)."""


class InvalidDistribution(PredictorError, ValueError):
    """Length quantiles are negative or not in increasing order."""


class JobGraphInvalid(PredictorError, ValueError):
    """A job's nodes name an unknown parent or form a cycle."""


class ArtifactMissing(PredictorError, FileNotFoundError):
    """The trained model file is absent: train it or pass another path."""


class ArtifactInvalid(PredictorError):
    """The trained model file is corrupt or was written by an incompatible version."""


class LabelsInvalid(PredictorError, ValueError):
    """A labels file is malformed, empty, or names prompts its source does not hold."""


class PromptsMissing(PredictorError, FileNotFoundError):
    """A prompt source's data file is absent: pass --data pointing at the shared data folder."""


class NotEnoughData(PredictorError, ValueError):
    """Too few samples to fit a model (training rows, measured engine steps)."""


class QuantileOutOfRange(PredictorError, ValueError):
    """A quantile level outside [0, 1] was asked for."""
