"""The jobs this gateway process runs or has run, by id and by idempotency key.

A tenant only ever sees its own jobs: a lookup of another tenant's job is NotFound, exactly
like a job that does not exist. Ended jobs are kept for lookups until `max_ended` newer ones
have ended, then dropped, oldest first.
"""

from __future__ import annotations

from collections import OrderedDict

from gateway.errors import NotFound
from gateway.job_run import JobRun


class JobRegistry:
    def __init__(self, max_ended: int = 10_000) -> None:
        self.max_ended = max_ended
        self._jobs: dict[str, JobRun] = {}
        self._keys: dict[tuple[str, str], str] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()

    def add(self, run: JobRun) -> None:
        self._jobs[run.job_id] = run
        if run.spec.idempotency_key:
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
        """Note an ended job; forget the oldest ended ones beyond the limit."""
        self._ended[run.job_id] = None
        while len(self._ended) > self.max_ended:
            job_id, _ = self._ended.popitem(last=False)
            old = self._jobs.pop(job_id)
            if old.spec.idempotency_key:
                self._keys.pop((old.tenant_id, old.spec.idempotency_key), None)

    def __len__(self) -> int:
        return len(self._jobs)
