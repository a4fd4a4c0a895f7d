"""Jobs: the DAG-of-calls model, its conversion from protos, graph analysis, templates and
validation. Pure code: no I/O, no clock."""

from gateway.jobs.convert import job_spec_from_proto, job_spec_to_proto
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
from gateway.jobs.validation import JobLimits, input_sizes, oversized_prompt, validate_job

__all__ = [
    "ChatMessage",
    "Dag",
    "DagCyclic",
    "DagUnknownNode",
    "FieldViolation",
    "JobInvalid",
    "JobLimits",
    "JobSpec",
    "NodeSpec",
    "RefKind",
    "Reference",
    "SamplingSpec",
    "TemplateUnresolved",
    "input_sizes",
    "job_spec_from_proto",
    "job_spec_to_proto",
    "oversized_prompt",
    "references",
    "render",
    "render_node",
    "rendered_chars",
    "validate_job",
]
