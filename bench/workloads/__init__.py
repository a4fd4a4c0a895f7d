"""Workloads built from the real data in ../shared/data."""

from bench.workloads.engine_workload import EngineWorkload, build_engine_workload

__all__ = ["EngineWorkload", "build_engine_workload"]
