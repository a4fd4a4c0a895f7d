"""Tenants and their arrivals, from the ServeGen per-client statistics.

A ServeGen client file (`chunk-<id>-trace.csv`) lists 600 s windows of one client: its request
rate and the coefficient of variation (CV) of its inter-arrival times. A client's mean rate is
the mean over its active windows and its CV the rate-weighted mean of the window CVs. The study's
tenants are the busiest clients (with at least `min_windows` active windows): the busiest is the
heavy tenant (agent sessions: many large jobs), the next ones are light tenants with small or
task-parallel jobs. A tenant's share of the jobs is its client's share of the rate.

Arrivals are a Gamma renewal process with the client's CV (shape 1/CV^2), conditioned on the
tenant's job count over the horizon: n+1 Gamma gaps, their running sums scaled so the last one
lands on the horizon. Bursts and lulls keep their shape; the realised rate is exactly the share.
Invariant: arrival times are sorted and lie in [0, horizon].
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.errors import DataMissing
from bench.paths import data_missing

SERVEGEN_CLIENTS = Path("traces/servegen/data/language/m-small")


@dataclass(frozen=True, slots=True)
class ServeGenClient:
    name: str
    mean_rate: float  # requests per second over its active windows
    cv: float  # rate-weighted mean CV of inter-arrival times
    active_windows: int


@dataclass(frozen=True, slots=True)
class TenantSpec:
    name: str
    weight: float
    share: float  # fraction of all jobs
    cv: float
    kinds: tuple[tuple[str, float], ...]  # (job kind, probability)
    client: str  # the ServeGen client it was drawn from


# The heavy tenant first, then light ones; each profile is the mix of job kinds a tenant submits.
TENANT_PROFILES: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = (
    ("agents", (("agent", 1.0),)),
    ("chat", (("chat", 1.0),)),
    ("code", (("code", 0.7), ("plan_execute", 0.3))),
    ("docs", (("map_reduce", 0.6), ("chat", 0.4))),
    ("eval", (("sample_vote", 0.7), ("code", 0.3))),
)


def read_client(path: Path) -> ServeGenClient | None:
    """A client's statistics, or None when it was never active."""
    rates, cvs = [], []
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.reader(f):
            if len(row) >= 3 and float(row[1]) > 0:
                rates.append(float(row[1]))
                cvs.append(float(row[2]))
    if not rates:
        return None
    rate = np.asarray(rates)
    cv = float(np.dot(rate, np.asarray(cvs)) / rate.sum())
    name = path.name.removesuffix("-trace.csv")
    return ServeGenClient(name, float(rate.mean()), cv, len(rates))


def load_clients(data_dir: Path, min_windows: int = 100) -> list[ServeGenClient]:
    """Clients active in at least `min_windows` windows, busiest first (ties: name)."""
    folder = data_dir / SERVEGEN_CLIENTS
    paths = sorted(folder.glob("chunk-*-trace.csv"))
    if not paths:
        raise data_missing(f"no ServeGen client traces in {folder}")
    clients = [c for c in map(read_client, paths) if c and c.active_windows >= min_windows]
    if len(clients) < len(TENANT_PROFILES):
        raise DataMissing(f"{folder}: {len(clients)} busy clients, need {len(TENANT_PROFILES)}")
    return sorted(clients, key=lambda c: (-c.mean_rate, c.name))


def default_tenants(clients: list[ServeGenClient]) -> list[TenantSpec]:
    chosen = clients[: len(TENANT_PROFILES)]
    total = sum(c.mean_rate for c in chosen)
    return [
        TenantSpec(name, 1.0, c.mean_rate / total, c.cv, kinds, c.name)
        for (name, kinds), c in zip(TENANT_PROFILES, chosen, strict=True)
    ]


def gamma_arrivals(rng: np.random.Generator, count: int, cv: float, horizon: float) -> np.ndarray:
    """`count` arrival times in [0, horizon] of a Gamma renewal process with this CV."""
    if count <= 0:
        return np.zeros(0)
    if not cv > 0:
        raise ValueError(f"cv must be > 0, got {cv}")
    shape = 1.0 / cv**2
    sums = np.cumsum(rng.gamma(shape, 1.0, size=count + 1))
    times: np.ndarray = horizon * sums[:-1] / sums[-1]
    return times
