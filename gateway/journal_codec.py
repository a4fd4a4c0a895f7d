"""Journal records: a job's events, its submission and its snapshots as the strings the
journal stores.

An event is one compact JSON object (its sequence number is the stream entry's id, not part of
the record); a submission is the job's own fields beside its spec as the JobSpec proto, so
what a replica replays is exactly what was submitted; a snapshot is the job's state as of one
sequence (every field replaying its events sets), so a replica answering for the job replays
only the events after it. Pure: no I/O.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from dataclasses import dataclass

from fairgate.v1 import gateway_pb2 as pb
from gateway.gateway_protos import job_spec_from_proto, job_spec_to_proto
from gateway.job_run import (
    JobEnded,
    JobEvent,
    JobRun,
    JobState,
    NodeChanged,
    NodeState,
    TokensAdded,
)
from gateway.jobs.model import JobSpec

DECODE_PIECE_CHARS = 1024 * 1024  # base64 characters decoded at once (a multiple of 4)
_JOB_TIMES = ("started_at", "finished_at")
# a node's fields in a snapshot, in order; a PENDING node has never changed and is left out
_NODE_FIELDS = (
    "output",
    "prompt_tokens",
    "output_tokens",
    "reason",
    "hit_length",
    "attempts",
    "ready_at",
    "started_at",
    "first_token_at",
    "finished_at",
)


def encode_event(event: JobEvent) -> str:
    body = event.body
    record: dict[str, object] = {"t": event.time}
    if isinstance(body, NodeChanged):
        record |= {"n": body.node_id, "s": body.state.value, "p": body.previous.value}
        if body.reason:
            record["r"] = body.reason
        if body.prompt_tokens:
            record["pt"] = body.prompt_tokens
        if body.hit_length:
            record["hl"] = 1
    elif isinstance(body, TokensAdded):
        record |= {"n": body.node_id, "x": body.text, "i": list(body.token_ids)}
    else:
        record["e"] = body.state.value
    return json.dumps(record, separators=(",", ":"))


def decode_event(sequence: int, text: str) -> JobEvent:
    record = json.loads(text)
    body: NodeChanged | TokensAdded | JobEnded
    if "e" in record:
        body = JobEnded(JobState(record["e"]))
    elif "x" in record:
        body = TokensAdded(record["n"], record["x"], tuple(record["i"]))
    else:
        body = NodeChanged(
            record["n"],
            NodeState(record["s"]),
            NodeState(record["p"]),
            record.get("r", ""),
            record.get("pt", 0),
            bool(record.get("hl", 0)),
        )
    return JobEvent(sequence, float(record["t"]), body)


def encode_snapshot(run: JobRun) -> str:
    """The job's state as of its last event (`run.last_sequence`)."""
    nodes = [
        [node_id, node.state.value, *(getattr(node, f) for f in _NODE_FIELDS)]
        for node_id, node in run.nodes.items()
        if node.state is not NodeState.PENDING
    ]
    record = {
        "q": run.last_sequence,
        "s": run.state.value,
        "t": [getattr(run, f) for f in _JOB_TIMES],
        "n": nodes,
    }
    return json.dumps(record, separators=(",", ":"))


def restore_snapshot(run: JobRun, text: str) -> None:
    """Bring a fresh run of the job's submission to the snapshot's state: its events after
    the snapshot's sequence replay on from there."""
    record = json.loads(text)
    run.state = JobState(record["s"])
    for name, value in zip(_JOB_TIMES, record["t"], strict=True):
        setattr(run, name, value)
    for node_id, state, *values in record["n"]:
        node = run.nodes[node_id]
        node.state = NodeState(state)
        for name, value in zip(_NODE_FIELDS, values, strict=True):
            setattr(node, name, value)
    run.replayed_to(record["q"])


@dataclass(frozen=True, slots=True)
class Submission:
    """What a replica needs besides the events to stand a job up again."""

    job_id: str
    tenant_id: str
    created_at: float
    key_id: str
    fingerprint: str
    streamed: bool
    spec: str  # the JobSpec proto, base64 ('' when read without it: `SUBMISSION_WITHOUT_SPEC`)

    @classmethod
    def of(cls, run: JobRun) -> Submission:
        spec = job_spec_to_proto(run.spec).SerializeToString(deterministic=True)
        return cls(
            run.job_id,
            run.tenant_id,
            run.created_at,
            run.key_id,
            run.fingerprint,
            run.streamed,
            base64.b64encode(spec).decode(),
        )

    def fields(self) -> dict[str, str]:
        return {
            "job_id": self.job_id,
            "tenant_id": self.tenant_id,
            "created_at": repr(self.created_at),
            "key_id": self.key_id,
            "fingerprint": self.fingerprint,
            "streamed": "1" if self.streamed else "0",
            "spec": self.spec,
        }

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> Submission:
        return cls(
            fields["job_id"],
            fields["tenant_id"],
            float(fields["created_at"]),
            fields["key_id"],
            fields["fingerprint"],
            fields["streamed"] == "1",
            fields.get("spec", ""),
        )

    def decoded_spec(self) -> JobSpec:
        """Its spec; the base64 a piece at a time, so that in a worker thread the event loop
        runs between the pieces (one call holds the GIL throughout: ~30 ms for a 15 MiB spec)."""
        step = DECODE_PIECE_CHARS
        spec = self.spec
        raw = b"".join(base64.b64decode(spec[i : i + step]) for i in range(0, len(spec), step))
        return job_spec_from_proto(pb.JobSpec.FromString(raw))

    def run(self, spec: JobSpec | None = None) -> JobRun:
        """A fresh JobRun of this submission, before any event; `spec`: its spec, decoded
        already (a job's spec never changes)."""
        if spec is None:
            spec = self.decoded_spec()
        run = JobRun(self.job_id, self.tenant_id, spec, self.created_at)
        run.key_id, run.fingerprint, run.streamed = self.key_id, self.fingerprint, self.streamed
        return run


# the hash fields of a submission but its spec (a replica that has decoded the spec reads these)
SUBMISSION_WITHOUT_SPEC = tuple(f.name for f in dataclasses.fields(Submission) if f.name != "spec")
