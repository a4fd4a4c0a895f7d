"""Workloads built from the real data in the data directory (docs/DATA.md, `bench.paths`)."""

from bench.workloads.engine_workload import EngineWorkload, build_engine_workload

__all__ = ["EngineWorkload", "build_engine_workload"]
