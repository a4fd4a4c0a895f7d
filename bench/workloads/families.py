"""Workload families: tenant mixes beyond the ServeGen default, to test the policies out of sample.

Every family is a list of `TenantSpec`s for `build_workload` (so the seed, job count, lengths
and the JSONL format are the default's); they differ in what a fair order has to get right:

- `servegen`: the default (the ServeGen clients' rates and CVs, all weights 1; arrivals.py);
- `weighted`: three tenants of weights 1, 2 and 4 with the same mix of task-parallel jobs and
  equal shares of the jobs, Poisson arrivals: the weights alone set them apart;
- `bursty`: four tenants (weights 1, 2, 4, 1) whose arrivals come in bursts (CV 4), agent tasks
  beside chats, code and sampling jobs;
- `fanout`: a heavy tenant (weight 2) of deep chains (up to 8 calls) and wide map-reduces (up to
  64 maps) beside four light tenants of 2-call chains, 3-way map-reduces and sampling with a
  vote, Poisson arrivals;
- `sessions`: agent sessions for most of the jobs, three agent tenants (weights 1, 2, 4) and a
  chat tenant, moderately bursty arrivals (CV 2).

Shares are fractions of the jobs (not of the work). Invariant: every family's shares sum to 1
and names its job kinds from `TASK_KINDS` or `agent`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bench.workloads.arrivals import TenantSpec, default_tenants, load_clients

Kinds = tuple[tuple[str, float], ...]

POISSON, BURSTY, SESSION_CV = 1.0, 4.0, 2.0
MIXED: Kinds = (
    ("chat", 0.3),
    ("code", 0.2),
    ("plan_execute", 0.2),
    ("map_reduce", 0.15),
    ("sample_vote", 0.15),
)
LIGHT: Kinds = (("short_chain", 0.4), ("small_map_reduce", 0.3), ("sample_vote", 0.3))


def _synthetic(name: str, weight: float, share: float, cv: float, kinds: Kinds) -> TenantSpec:
    return TenantSpec(name, weight, share, cv, kinds, f"synthetic (cv {cv:g})")


def _weighted(_: Path) -> list[TenantSpec]:
    return [_synthetic(f"w{w}", float(w), 1 / 3, POISSON, MIXED) for w in (1, 2, 4)]


def _bursty(_: Path) -> list[TenantSpec]:
    return [
        _synthetic("agents", 1.0, 0.3, BURSTY, (("agent", 1.0),)),
        _synthetic("chat", 2.0, 0.35, BURSTY, (("chat", 1.0),)),
        _synthetic("code", 4.0, 0.2, BURSTY, (("code", 0.7), ("plan_execute", 0.3))),
        _synthetic("eval", 1.0, 0.15, BURSTY, (("sample_vote", 0.7), ("code", 0.3))),
    ]


def _fanout(_: Path) -> list[TenantSpec]:
    heavy = _synthetic("heavy", 2.0, 0.3, POISSON, (("chain", 0.5), ("wide_map_reduce", 0.5)))
    return [heavy] + [_synthetic(f"light{i}", 1.0, 0.175, POISSON, LIGHT) for i in range(4)]


def _sessions(_: Path) -> list[TenantSpec]:
    agent: Kinds = (("agent", 1.0),)
    return [
        _synthetic("agents1", 1.0, 0.35, SESSION_CV, agent),
        _synthetic("agents2", 2.0, 0.25, SESSION_CV, agent),
        _synthetic("agents4", 4.0, 0.15, SESSION_CV, agent),
        _synthetic("chat", 1.0, 0.25, SESSION_CV, (("chat", 1.0),)),
    ]


def _servegen(data_dir: Path) -> list[TenantSpec]:
    return default_tenants(load_clients(data_dir))


FAMILIES: dict[str, Callable[[Path], list[TenantSpec]]] = {
    "servegen": _servegen,
    "weighted": _weighted,
    "bursty": _bursty,
    "fanout": _fanout,
    "sessions": _sessions,
}


def family_tenants(name: str, data_dir: Path) -> list[TenantSpec]:
    """The family's tenants; `KeyError` naming the families for an unknown one."""
    if name not in FAMILIES:
        raise KeyError(f"unknown workload family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name](data_dir)
