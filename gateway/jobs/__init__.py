"""Jobs: the DAG-of-calls model (`JobSpec`, `NodeSpec`), its graph (`Dag`), templates that splice
inputs and parents' outputs into prompts (`render`, `references`), and validation (`validate_job`,
`JobLimits`, reporting every violation at once). Pure code: no I/O, no clock, no protos (the
servicers convert, `gateway/gateway_protos.py`)."""

from gateway.jobs.dag import Dag
from gateway.jobs.errors import (
    DagCyclic,
    DagUnknownNode,
    FieldViolation,
    JobInvalid,
    TemplateUnresolved,
)
from gateway.jobs.model import ChatMessage, JobSpec, NodeSpec, SamplingSpec
from gateway.jobs.template import (
    Reference,
    RefKind,
    references,
    render,
    render_node,
    rendered_chars,
)
from gateway.jobs.validation import (
    MAX_QUEUED_CHARS,
    PLACEHOLDERS_PER_NODE,
    JobCounts,
    JobLimits,
    NodeCounts,
    check_counts,
    check_node_count,
    check_templates,
    input_sizes,
    job_chars,
    oversized_prompt,
    validate_job,
)

__all__ = [
    "MAX_QUEUED_CHARS",
    "PLACEHOLDERS_PER_NODE",
    "ChatMessage",
    "Dag",
    "DagCyclic",
    "DagUnknownNode",
    "FieldViolation",
    "JobCounts",
    "JobInvalid",
    "JobLimits",
    "JobSpec",
    "NodeCounts",
    "NodeSpec",
    "RefKind",
    "Reference",
    "SamplingSpec",
    "TemplateUnresolved",
    "check_counts",
    "check_node_count",
    "check_templates",
    "input_sizes",
    "job_chars",
    "oversized_prompt",
    "references",
    "render",
    "render_node",
    "rendered_chars",
    "validate_job",
]
