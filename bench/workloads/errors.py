"""Workload failures, named for the state that stops a workload from being built or read."""

from bench.errors import BenchError


class WorkloadInvalid(BenchError):
    """A workload file or job breaks the format of docs/WORKLOADS.md."""


class LoadUnreachable(BenchError):
    """No arrival rate makes the workload offer the asked load to this engine."""
