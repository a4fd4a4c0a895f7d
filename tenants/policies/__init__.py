"""Fair-share policies: whose ready call the gateway dispatches next (docs/ARCHITECTURE.md §4)."""

from tenants.policies.base import (
    EngineLoad,
    JobInfo,
    NodeCost,
    Policy,
    ReadyCall,
    kv_token_time,
)
from tenants.policies.book import BookPolicy
from tenants.policies.errors import (
    CallNotFound,
    CallNotReady,
    CallNotRunning,
    DuplicateCall,
    DuplicateJob,
    InvalidCall,
    InvalidJob,
    InvalidProgress,
    JobNotFound,
    PolicyError,
    UnknownPolicy,
)
from tenants.policies.factory import POLICY_NAMES, make_policy
from tenants.policies.fcfs import FcfsPolicy
from tenants.policies.gps import GpsCall, GpsJob, gps_finish_times, water_fill
from tenants.policies.justitia import JustitiaPolicy
from tenants.policies.las import LasPolicy
from tenants.policies.sjf import SjfOraclePolicy
from tenants.policies.vtc import VtcPolicy

__all__ = [
    "POLICY_NAMES",
    "BookPolicy",
    "CallNotFound",
    "CallNotReady",
    "CallNotRunning",
    "DuplicateCall",
    "DuplicateJob",
    "EngineLoad",
    "FcfsPolicy",
    "GpsCall",
    "GpsJob",
    "InvalidCall",
    "InvalidJob",
    "InvalidProgress",
    "JobInfo",
    "JobNotFound",
    "JustitiaPolicy",
    "LasPolicy",
    "NodeCost",
    "Policy",
    "PolicyError",
    "ReadyCall",
    "SjfOraclePolicy",
    "UnknownPolicy",
    "VtcPolicy",
    "gps_finish_times",
    "kv_token_time",
    "make_policy",
    "water_fill",
]
