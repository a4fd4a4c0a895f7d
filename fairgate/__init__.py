"""fairgate: the gRPC contract (`fairgate.v1`, generated from protos/) and its async client SDK.

`Client` talks to the Gateway (jobs, Generate), `AdminClient` to the Admin service; job specs
come from `JobBuilder`, `map_reduce`, `parallel_sample` or `job_from_json`.
"""

from fairgate.admin import AdminClient
from fairgate.admin_results import ApiKey, IssuedKey, Quota, QuotaFields, Tenant, TenantPage, Usage
from fairgate.builder import JobBuilder, job_from_json, job_to_json, map_reduce, parallel_sample
from fairgate.client import Client
from fairgate.errors import (
    AlreadyExists,
    ErrorInfo,
    FairgateError,
    FieldViolation,
    InvalidArgument,
    JobSpecInvalid,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    QuotaViolation,
    Unauthenticated,
    Unavailable,
)
from fairgate.results import (
    FinishReason,
    GenerateFinished,
    Job,
    JobEvent,
    JobFinished,
    JobState,
    Node,
    NodeState,
    NodeStateChanged,
    TextDelta,
    TokenDelta,
    TokenUsage,
)

__all__ = [
    "AdminClient",
    "AlreadyExists",
    "ApiKey",
    "Client",
    "ErrorInfo",
    "FairgateError",
    "FieldViolation",
    "FinishReason",
    "GenerateFinished",
    "InvalidArgument",
    "IssuedKey",
    "Job",
    "JobBuilder",
    "JobEvent",
    "JobFinished",
    "JobSpecInvalid",
    "JobState",
    "Node",
    "NodeState",
    "NodeStateChanged",
    "NotFound",
    "PermissionDenied",
    "Quota",
    "QuotaExceeded",
    "QuotaFields",
    "QuotaViolation",
    "Tenant",
    "TenantPage",
    "TextDelta",
    "TokenDelta",
    "TokenUsage",
    "Unauthenticated",
    "Unavailable",
    "Usage",
    "job_from_json",
    "job_to_json",
    "map_reduce",
    "parallel_sample",
]
