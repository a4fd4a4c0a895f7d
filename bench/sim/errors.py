"""Simulation failures, named for the state that stops a simulation."""

from bench.errors import BenchError


class SimulationStuck(BenchError):
    """Calls are left but neither the engine nor any timer can make progress."""


class StepModelInvalid(BenchError):
    """A step-model file lacks a coefficient or holds a negative one."""


class ProbeUnsaturated(BenchError):
    """The capacity probe never filled the engine: the workload is too small to measure it."""
