"""Fair-share policies: whose ready call the gateway dispatches next (docs/ARCHITECTURE.md §4).

A policy keeps the `Policy` protocol (`base.py`: `JobInfo` and `ReadyCall` in, "what next?" and
"how urgent?" out, `now` always passed in); `BookPolicy` keeps the bookkeeping every policy shares.
`make_policy` builds one by name (`POLICY_NAMES`: fcfs, vtc, justitia, sjf-oracle, las) and
`make_serving_policy` only those a server can run (`SERVING_POLICY_NAMES`). Also here, because the
policies and the gateway both need them: the cost unit `kv_token_time` and the one topological
order of a job's DAG (`dag.py`).
"""

from tenants.policies.base import (
    EngineLoad,
    JobInfo,
    NodeCost,
    Policy,
    ReadyCall,
    kv_token_time,
)
from tenants.policies.bookkeeping import BookPolicy
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
    PolicyNotServable,
    UnknownPolicy,
)
from tenants.policies.factory import (
    POLICY_NAMES,
    SERVING_POLICY_NAMES,
    check_servable,
    make_policy,
    make_serving_policy,
)
from tenants.policies.fcfs import FcfsPolicy
from tenants.policies.justitia import JustitiaPolicy
from tenants.policies.las import LasPolicy
from tenants.policies.sjf import SjfOraclePolicy
from tenants.policies.vtc import VtcPolicy

__all__ = [
    "POLICY_NAMES",
    "SERVING_POLICY_NAMES",
    "BookPolicy",
    "CallNotFound",
    "CallNotReady",
    "CallNotRunning",
    "DuplicateCall",
    "DuplicateJob",
    "EngineLoad",
    "FcfsPolicy",
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
    "PolicyNotServable",
    "ReadyCall",
    "SjfOraclePolicy",
    "UnknownPolicy",
    "VtcPolicy",
    "check_servable",
    "kv_token_time",
    "make_policy",
    "make_serving_policy",
]
