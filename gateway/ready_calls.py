"""The ready calls of a dispatch core, by id, indexed by job and by tenant.

One tenant may hold tens of thousands of ready calls (its queued jobs times their nodes). The
core answers per event (a job ended or cancelled, a share exchange, a grant) questions about one
job, about the tenants with ready calls, or about how many protected calls each has (every
admission at the refusing overload level); answering them by scanning every ready call made each
such event cost every tenant time in proportion to that one tenant's backlog (20 ms a job end at
65,000 ready calls). The index answers them in proportion to what they ask about.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterator, MutableMapping, ValuesView
from typing import Protocol, TypeVar

from tenants.policies import ReadyCall


class Entry(Protocol):
    @property
    def call(self) -> ReadyCall: ...

    @property
    def sheddable(self) -> bool: ...


E = TypeVar("E", bound=Entry)


class ReadyCalls(MutableMapping[str, E]):
    def __init__(self) -> None:
        self._calls: dict[str, E] = {}
        self._by_job: dict[str, dict[str, E]] = {}
        self._jobs_of: dict[str, set[str]] = {}  # tenant -> its jobs with a ready call
        self._protected: Counter[str] = Counter()  # tenant -> its calls that are not sheddable
        self._count: Counter[str] = Counter()  # tenant -> its calls
        self.sheddable = 0  # calls that are

    def __getitem__(self, call_id: str) -> E:
        return self._calls[call_id]

    def __setitem__(self, call_id: str, entry: E) -> None:
        if call_id in self._calls:
            del self[call_id]  # and added again, last
        call = entry.call
        self._calls[call_id] = entry
        self._by_job.setdefault(call.job_id, {})[call_id] = entry
        self._jobs_of.setdefault(call.tenant_id, set()).add(call.job_id)
        self._protected[call.tenant_id] += not entry.sheddable
        self._count[call.tenant_id] += 1
        self.sheddable += entry.sheddable

    def __delitem__(self, call_id: str) -> None:
        entry = self._calls.pop(call_id)
        call = entry.call
        self._protected[call.tenant_id] -= not entry.sheddable
        self._count[call.tenant_id] -= 1
        self.sheddable -= entry.sheddable
        calls = self._by_job[call.job_id]
        del calls[call_id]
        if not calls:
            del self._by_job[call.job_id]
            jobs = self._jobs_of[call.tenant_id]
            jobs.discard(call.job_id)
            if not jobs:
                del self._jobs_of[call.tenant_id], self._protected[call.tenant_id]
                del self._count[call.tenant_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._calls)

    def __len__(self) -> int:
        return len(self._calls)

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._calls

    def values(self) -> ValuesView[E]:
        return self._calls.values()

    def of_job(self, job_id: str) -> list[E]:
        """The job's ready calls."""
        return list(self._by_job.get(job_id, {}).values())

    def jobs(self, tenant_id: str) -> Collection[str]:
        """The tenant's jobs with a ready call."""
        return self._jobs_of.get(tenant_id, set())

    def protected(self, tenant_id: str) -> int:
        """How many of the tenant's ready calls are protected (their jobs do not give way)."""
        return self._protected[tenant_id]

    def count(self, tenant_id: str) -> int:
        """How many ready calls the tenant has."""
        return self._count[tenant_id]

    def tenants(self) -> Collection[str]:
        """The tenants with a ready call."""
        return self._jobs_of.keys()
