"""The job registry's bookkeeping: an ended job is counted once, and a job given back to the
journal (it runs on elsewhere) is not kept here."""

from __future__ import annotations

from gateway.job_run import JobRun
from gateway.jobs.model import JobSpec
from gateway.registry import JobRegistry
from tests.gateway.jobs.factories import make_node


def run(job_id: str) -> JobRun:
    return JobRun(job_id, "acme", JobSpec(nodes=(make_node("n", "say n"),)), 0.0)


def test_a_job_noted_ended_twice_counts_once_against_its_tenants_limits() -> None:
    first, second = run("job-1"), run("job-2")
    for job in (first, second):
        job.cancel(1.0, "cancelled")
    both = first.retained_bytes() + second.retained_bytes()
    jobs = JobRegistry(max_ended_per_tenant=2, max_ended_bytes_per_tenant=both)
    for job in (first, second):
        jobs.add(job)
    jobs.ended(first)
    jobs.ended(first)  # the service and the dispatcher both saw it end
    jobs.ended(second)
    assert jobs.get("acme", "job-1") is first  # both fit within the limits


def test_a_job_given_back_is_forgotten_but_not_another_run_of_it() -> None:
    jobs = JobRegistry()
    given_back = run("job-1")
    jobs.add(given_back)
    jobs.discard(given_back)
    assert len(jobs) == 0
    taken_again = run("job-1")  # claimed again by this replica
    jobs.add(taken_again)
    jobs.discard(given_back)  # a late discard of the old run leaves the new one
    assert jobs.get("acme", "job-1") is taken_again
