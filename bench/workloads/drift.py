"""A drifting tenant among honest ones: the conservative-mode experiment's workload.

Honest tenants and one drifting tenant each submit `jobs_per_tenant` one-call jobs (node `chat`,
the kind the predictor and the error tracker key on) at uniform random times over a horizon of
`jobs_per_tenant` time units (a Poisson stream conditioned on its count; `bench.workloads.load`
rescales it to a load). Prompts and outputs are log-normal (a median and the sigma of the log),
rounded and clipped to [1, max_tokens] (prompts to [1, `MAX_PROMPT`]). The honest tenants'
outputs keep one law; the drifting tenant's jobs that arrive in the first half of the horizon
produce short outputs (kind `SHORT`), those of the second half long ones (kind `LONG`). Each
tenant draws from its own generator seeded by `(seed, tenant index)`. Invariant: the same config
gives the same jobs, sorted by arrival then id; every job passes the workload format's checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.workloads.format import Job, Node, validate_workload, validate_workload_job

HONEST, SHORT, LONG = "honest", "drift-short", "drift-long"  # job kinds
NODE = "chat"
MAX_PROMPT = 1024


@dataclass(frozen=True, slots=True)
class LengthLaw:
    median: float
    sigma: float  # standard deviation of the log

    def draw(self, rng: np.random.Generator, low: int, high: int) -> int:
        return int(np.clip(round(self.median * np.exp(self.sigma * rng.normal())), low, high))


@dataclass(frozen=True, slots=True)
class DriftWorkload:
    jobs_per_tenant: int = 240
    honest: tuple[str, ...] = ("a", "b", "c")
    drifting: str = "drift"
    prompt: LengthLaw = LengthLaw(256, 0.5)
    honest_output: LengthLaw = LengthLaw(128, 0.6)
    short_output: LengthLaw = LengthLaw(32, 0.6)  # the drifting tenant before the drift
    long_output: LengthLaw = LengthLaw(400, 0.3)  # and after
    max_tokens: int = 512
    seed: int = 0

    @property
    def drift_at(self) -> float:
        """Where the drift happens on the unscaled horizon: half-way."""
        return self.jobs_per_tenant / 2

    def build(self) -> list[Job]:
        jobs = []
        for index, tenant in enumerate((*self.honest, self.drifting)):
            rng = np.random.default_rng([self.seed, index])
            arrivals = np.sort(rng.uniform(0.0, float(self.jobs_per_tenant), self.jobs_per_tenant))
            for k, arrival in enumerate(arrivals):
                kind = self._kind(tenant, float(arrival))
                output = self._output_law(kind).draw(rng, 1, self.max_tokens)
                prompt = self.prompt.draw(rng, 1, MAX_PROMPT)
                node = Node(NODE, (), prompt, output, self.max_tokens)
                job = Job(f"{tenant}-{k:04d}", tenant, 1.0, float(arrival), kind, (node,))
                validate_workload_job(job)
                jobs.append(job)
        validate_workload(jobs)
        return sorted(jobs, key=lambda j: (j.arrival, j.job_id))

    def _kind(self, tenant: str, arrival: float) -> str:
        if tenant != self.drifting:
            return HONEST
        return SHORT if arrival < self.drift_at else LONG

    def _output_law(self, kind: str) -> LengthLaw:
        return {HONEST: self.honest_output, SHORT: self.short_output}.get(kind, self.long_output)
