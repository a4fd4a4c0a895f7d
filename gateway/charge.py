"""What a call's end costs its tenant: the settle or the release its quota store is told.

A call that ran to its end (neither the gateway nor its backend failed it, and its node was
still open) is settled for what it produced, and finishes its job in the same script when its
node is the job's last open one. A call whose node its tenant's side ended first (a cancel, a
deadline: `JobRun.charge_cut_short`) is settled for the tokens its node took before it ended,
which its client has had (else a tenant could read all but the last token of every call and
cancel it, for free). A call the gateway cut short, one that failed, and one that took nothing
are released: the tenant pays for no work it could not have.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine import FinishReason, TokenDelta
from gateway.job_run import ENDED, JobRun
from gateway.outbox import Close
from tenants.policies import ReadyCall


@dataclass(frozen=True, slots=True)
class CallCharge:
    close: Close  # the settle or release to send
    finished: bool  # its node ends with the call's output
    settled: int | None  # the output tokens settled; None: released
    reason: str = ""  # why its node fails, when it did not finish


def charge(
    run: JobRun,
    call: ReadyCall,
    quota_id: str,
    last: TokenDelta | None,
    produced: int,
    failure: str,
) -> CallCharge:
    """The close of the attempt reserved as `quota_id`, whose stream ended with `last` after
    `produced` output tokens; `failure` says why the gateway failed it ("" when it did not)."""
    node = run.nodes[call.node_id]
    engine_error = last is not None and last.finish_reason is FinishReason.ERROR
    ran = not failure and not engine_error
    cut_short = node.state in ENDED
    finished = ran and last is not None and last.finished and not cut_short
    made = produced if finished else node.output_tokens
    reason = failure or ("engine error" if engine_error else "call aborted by the engine")
    reason = "" if finished else reason
    if not (finished or (ran and cut_short and run.charge_cut_short and made > 0)):
        return CallCharge(Close("release", call.tenant_id, quota_id), False, None, reason)
    ends_job = finished and run.is_last_open(call.node_id)
    close = Close(
        "settle",
        call.tenant_id,
        quota_id,
        call.prompt_tokens,
        made,
        run.job_id if ends_job else None,
    )
    return CallCharge(close, finished, made, reason)
