"""The fair-scheduling study's simulator: the gateway's dispatch loop over the real engine core.

See `simulator.py` for the event loop, `study.py` for the plan of runs, `gps.py` for the GPS
reference that judges them (docs/GPS.md) and `bench/sched.py` for the command; `conservative.py`
runs the gateway's conservative mode against a tenant whose outputs drift
(`python -m bench.sim.conservative`).
"""

from bench.sim.errors import ProbeUnsaturated, SimulationStuck, StepModelInvalid
from bench.sim.gps import GpsCall, GpsJob, gps_finish_times, water_fill
from bench.sim.metrics import RunMetrics, jain_index, run_metrics
from bench.sim.predictions import (
    CallEstimate,
    CallPredictor,
    FixedPredictions,
    lying,
    noisy,
    oracle,
)
from bench.sim.reference import bound_slack, gps_finish, solo_call_seconds
from bench.sim.regime import Regime, cpu_regime, gpu_regime, load_step_model
from bench.sim.runner import TraceRunner
from bench.sim.setup import Prepared, engine_setup, prepare
from bench.sim.simulator import EngineSetup, SimResult, Simulation
from bench.sim.study import Study, StudyConfig, StudyResult
from bench.sim.summary import summary_json
from bench.sim.targets import check_targets

__all__ = [
    "CallEstimate",
    "CallPredictor",
    "EngineSetup",
    "FixedPredictions",
    "GpsCall",
    "GpsJob",
    "Prepared",
    "ProbeUnsaturated",
    "Regime",
    "RunMetrics",
    "SimResult",
    "Simulation",
    "SimulationStuck",
    "StepModelInvalid",
    "Study",
    "StudyConfig",
    "StudyResult",
    "TraceRunner",
    "bound_slack",
    "check_targets",
    "cpu_regime",
    "engine_setup",
    "gps_finish",
    "gps_finish_times",
    "gpu_regime",
    "jain_index",
    "load_step_model",
    "lying",
    "noisy",
    "oracle",
    "prepare",
    "run_metrics",
    "solo_call_seconds",
    "summary_json",
    "water_fill",
]
