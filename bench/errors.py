"""Benchmark failures, named for the state that stops a benchmark."""


class BenchError(Exception):
    """Base class of the benchmark errors."""


class DataMissing(BenchError):
    """A data file the workload needs is absent or too short."""


class WorkerFailed(BenchError):
    """An engine's benchmark subprocess exited with an error or wrote no result."""


class VenvSetupFailed(BenchError):
    """The separate virtualenv of a peer engine could not be created."""


class WrongOutputLength(BenchError):
    """An engine generated a different number of tokens than a request asked for."""
