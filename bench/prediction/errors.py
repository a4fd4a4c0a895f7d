"""Failures of the predictor's offline work: labelling, training and evaluation."""

from bench.errors import BenchError


class LabelsInvalid(BenchError, ValueError):
    """A labels file is malformed, empty, or names prompts its source does not hold."""


class NotEnoughData(BenchError, ValueError):
    """Too few labelled prompts or samples to fit a model or compute a metric."""
