"""The fair-share policy interface and the plain data it speaks.

A policy orders ready LLM calls of tenants' jobs (DAGs of calls). The dispatch loop tells it what
happens: a job arrives with predicted per-node costs, a call becomes ready, the loop dispatches the
call the policy shows first, the engine reports tokens and the finish, the job leaves; a call's
output may be predicted again (`on_refined`: while it is ready, when its kind of call is found to
mispredict, or once it is prefilled). The policy
only answers "what next?" (`peek`) and "how important is this call?" (`priority`, which the engine
uses to pick preemption victims). Policies do no I/O and never read a clock: every method takes
`now` (seconds, any monotonic origin).

Cost unit: KV token-time (docs/ARCHITECTURE.md §3), `kv_token_time(p, d)`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


def kv_token_time(prompt_tokens: float, output_tokens: float) -> float:
    """KV token-steps a call holds: prompt p plus i outputs at decode step i, for i = 1..d."""
    return prompt_tokens * output_tokens + output_tokens * (output_tokens + 1) / 2


@dataclass(frozen=True, slots=True)
class NodeCost:
    """One node of a job as the policy sees it at arrival, before anything ran."""

    node_id: str
    parents: tuple[str, ...]
    prompt_tokens: int  # predicted rendered prompt; the ready call carries the actual one
    predicted_output: float  # the predictor's estimate (tokens)
    max_tokens: int  # the enforced cap on output tokens
    true_output: int | None = None  # the real output length: sjf-oracle and studies only


@dataclass(frozen=True, slots=True)
class JobInfo:
    job_id: str
    tenant_id: str
    weight: float  # the tenant's weight (> 0) when the job arrives
    arrival: float  # seconds, same origin as `now`
    nodes: tuple[NodeCost, ...]
    # orders the tenant's own jobs (higher first) without changing the share between tenants;
    # negative marks the job sheddable under overload
    priority: int = 0


@dataclass(frozen=True, slots=True)
class ReadyCall:
    """A node whose parents are done and whose prompt is rendered: it can be dispatched."""

    call_id: str
    job_id: str
    tenant_id: str
    node_id: str
    prompt_tokens: int  # actual rendered prompt length
    predicted_output: float
    max_tokens: int


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """The engine's room as the dispatch loop sees it when it asks for the next call."""

    running_calls: int  # calls admitted and not finished
    batch_tokens: int  # tokens in the engine's current batch (informational)
    knee_calls: int | None  # batch size past which step efficiency saturates; None: no knee
    # of the running calls, those of the jobs this policy holds, where the engine also runs
    # other gateways' calls (replicas sharing it: the policy sees only its own jobs); None: all
    own_calls: int | None = None

    @property
    def calls_of_these_jobs(self) -> int:
        """The running calls of the jobs this policy holds."""
        return self.running_calls if self.own_calls is None else self.own_calls


class Policy(Protocol):
    """One fair-share order. Lifecycle of a call: ready -> dispatched -> progress* -> finished.

    `peek` is pure (repeated calls return the same answer until something changes); the caller
    dispatches the answer with `mark_dispatched`. `remove_job` forgets the job's ready and running
    calls: the caller aborts its running calls in the engine and reports nothing more for them.
    `requeue` puts a running call whose backend was lost back among the ready calls. While
    `set_shedding(True)` holds, the ready calls of sheddable jobs (negative priority) are not shown.
    A held call (`hold`: its quota is being reserved) and the ready calls of a held tenant
    (`hold_tenant`: a quota refused it until `until`) stay ready but are not shown by `peek`.
    """

    name: str
    # whether the policy shares the backends among tenants by weight (a shared pool charges
    # each tenant's service per unit of its weight); otherwise its order is its jobs' own keys
    by_weight: bool

    def add_job(self, job: JobInfo, now: float) -> None: ...

    def add_ready(self, call: ReadyCall, now: float) -> None: ...

    def peek(self, now: float, load: EngineLoad) -> ReadyCall | None: ...

    def mark_dispatched(self, call_id: str, now: float) -> None: ...

    def hold(self, call_id: str) -> None: ...

    def unhold(self, call_id: str) -> None: ...

    def hold_tenant(self, tenant_id: str, until: float) -> None: ...

    def unhold_tenant(self, tenant_id: str) -> None: ...

    def hold_job(self, job_id: str) -> None: ...

    def unhold_job(self, job_id: str) -> None: ...

    def set_shedding(self, on: bool) -> None: ...

    def on_progress(self, call_id: str, output_tokens: int, now: float) -> None: ...

    def on_refined(self, call_id: str, predicted_output: float, now: float) -> None: ...

    def on_finished(
        self, call_id: str, prompt_tokens: int, output_tokens: int, now: float
    ) -> None: ...

    def requeue(self, call_id: str, now: float) -> None: ...

    def remove_job(self, job_id: str, now: float) -> None: ...

    def priority(self, call_id: str) -> float: ...

    def pool_offsets(self, job_ids: Iterable[str], now: float) -> dict[str, float]:
        """For each of these active jobs, its place in a shared pool's order beyond its
        tenant's service (gateway/share.py: several gateways order their calls as one by
        `service + offset`, least first); a job absent has 0. By weight (`by_weight`): the
        service its tenant must still receive (KV token-time per unit of weight) before the job
        would end under the fair share, by this policy's estimates, or none for a policy that
        orders tenants only. Otherwise there is no service, and the offset is the job's own
        key in the policy's order at `now` (its arrival, its attained service). Asked for the jobs
        with a ready call on every dispatch pass: only those."""
        ...
