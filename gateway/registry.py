"""The jobs this gateway process runs or has run, by id and by idempotency key.

A tenant only ever sees its own jobs: a lookup of another tenant's job is NotFound, exactly like a
job that does not exist. Each tenant's ended jobs are kept for lookups while there are at most
`max_ended_per_tenant` of them and they hold at most `max_ended_bytes_per_tenant` (each job's size
taken as it ends: `JobRun.retained_bytes`), then dropped, oldest first, with their idempotency
keys, though never the newest (its client may still ask for it): one tenant's churn never evicts
another's jobs, and one tenant's large jobs are held in bounded memory. A deleted tenant's jobs are
forgotten at once, so a tenant created again under the same id never sees them.
Job ids are minted here (`new_job_id`); an id of another shape names no job (`check_job_id`),
which is answered before any lookup: a 10,000-character id quoted back overflowed the reply's
metadata, and one naming a journal key that is not a job's (`<job>:log`) made the journal fail.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter, OrderedDict, defaultdict

from gateway.errors import NotFound
from gateway.job_run import JobRun

MAX_ENDED_PER_TENANT = 1000
MAX_ENDED_BYTES_PER_TENANT = 64 << 20
JOB_ID = re.compile(r"job-[0-9a-f]{16}")


def new_job_id() -> str:
    return f"job-{uuid.uuid4().hex[:16]}"


def check_job_id(job_id: str) -> None:
    """NotFound for an id no job of this gateway's can have."""
    if not JOB_ID.fullmatch(job_id):
        raise NotFound("no such job: a job id is `job-` and 16 hex digits")


class JobRegistry:
    def __init__(
        self,
        max_ended_per_tenant: int = MAX_ENDED_PER_TENANT,
        max_ended_bytes_per_tenant: int = MAX_ENDED_BYTES_PER_TENANT,
    ) -> None:
        if max_ended_per_tenant < 1:
            raise ValueError("max_ended_per_tenant must be at least 1")
        self.max_ended_per_tenant = max_ended_per_tenant
        self.max_ended_bytes_per_tenant = max_ended_bytes_per_tenant
        self._jobs: dict[str, JobRun] = {}
        self._keys: dict[tuple[str, str], str] = {}
        # per tenant, its ended jobs oldest first with their sizes, and their sum
        self._ended: defaultdict[str, OrderedDict[str, int]] = defaultdict(OrderedDict)
        self._ended_bytes: Counter[str] = Counter()

    def add(self, run: JobRun, *, keyed: bool = True) -> None:
        """`keyed`: its idempotency key names it here (a job taken over is not: the journal's
        record of the key may name another job, the retry of one abandoned)."""
        self._jobs[run.job_id] = run
        if keyed and run.spec.idempotency_key:
            self._keys[(run.tenant_id, run.spec.idempotency_key)] = run.job_id

    def get(self, tenant_id: str, job_id: str) -> JobRun:
        run = self._jobs.get(job_id)
        if run is None or run.tenant_id != tenant_id:
            raise NotFound(f"job {job_id!r} not found")
        return run

    def by_key(self, tenant_id: str, key: str) -> JobRun | None:
        job_id = self._keys.get((tenant_id, key))
        return self._jobs.get(job_id) if job_id is not None else None

    def ended(self, run: JobRun) -> None:
        """Note an ended job (once: again is nothing); forget the tenant's oldest ended ones
        beyond the limits."""
        if self._jobs.get(run.job_id) is not run:
            return  # its tenant was deleted, or it was given back
        tenant = run.tenant_id
        ended = self._ended[tenant]
        if run.job_id in ended:
            return
        ended[run.job_id] = size = run.retained_bytes()
        self._ended_bytes[tenant] += size
        while len(ended) > 1 and (
            len(ended) > self.max_ended_per_tenant
            or self._ended_bytes[tenant] > self.max_ended_bytes_per_tenant
        ):
            job_id, size = ended.popitem(last=False)
            self._ended_bytes[tenant] -= size
            self._drop(self._jobs[job_id])

    def discard(self, run: JobRun) -> None:
        """Forget a job that runs on elsewhere (given back to the journal before it ended here):
        it is kept by the journal, not by this process."""
        ended = self._ended.get(run.tenant_id)
        if self._jobs.get(run.job_id) is run and not (ended and run.job_id in ended):
            self._drop(run)

    def forget_tenant(self, tenant_id: str) -> None:
        """Drop every job of a deleted tenant (call after its running jobs were cancelled)."""
        for run in [r for r in self._jobs.values() if r.tenant_id == tenant_id]:
            self._drop(run)
        self._ended.pop(tenant_id, None)
        self._ended_bytes.pop(tenant_id, None)

    def of_tenant(self, tenant_id: str) -> list[JobRun]:
        return [r for r in self._jobs.values() if r.tenant_id == tenant_id]

    def _drop(self, run: JobRun) -> None:
        del self._jobs[run.job_id]
        key = (run.tenant_id, run.spec.idempotency_key)
        if run.spec.idempotency_key and self._keys.get(key) == run.job_id:
            del self._keys[key]

    def __len__(self) -> int:
        return len(self._jobs)
