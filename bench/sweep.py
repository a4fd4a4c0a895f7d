"""`fairgate bench sweep`: the scheduling study on every workload family and seed (issue 20).

For each family (`bench/workloads/families.py`) and seed it builds the workload, runs the study
(`bench.sim.study`: by default only the headline point, `gpu` at load 0.9, with every policy on
exact and noisy predictions and the attack pair) and judges the robust-scheduling targets
(`bench.sim.targets`); then, on the `weighted` family (weights 1, 2, 4) of each seed
(`--weighted-jobs`), each tenant's share of an engine saturated by a closed loop of clients,
under justitia and vtc (`bench.sim.weighted`). Writes a
Markdown table of every target on every family and seed (`--out`/sweep.md) and the numbers
(`--json`).

    python -m bench.sweep --json bench/out/sweep.json --workers 2
    fairgate bench sweep --families fanout --seeds 0 --jobs 200
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.paths import OUT_DIR, add_data_flag
from bench.sim.regime import gpu_regime
from bench.sim.study import Study, StudyConfig
from bench.sim.summary import Target, summary_json
from bench.sim.targets import check_targets
from bench.sim.weighted import WeightedShares, saturated_shares
from bench.workloads.build import DEFAULT_CONTEXT, DEFAULT_MAX_THINK_S, build_workload
from bench.workloads.families import FAMILIES, family_tenants
from bench.workloads.format import Job

POLICIES = ("fcfs", "vtc", "justitia", "sjf-oracle")
WEIGHTED_POLICIES = ("justitia", "vtc")
WEIGHTED_LIMIT = 0.1  # the largest |share / weight share - 1| (issue 20, point 5)


@dataclass(frozen=True, slots=True)
class FamilyRun:
    family: str
    seed: int
    jobs: int
    calls: int
    summary: dict[str, Any]
    targets: list[Target]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="fairgate bench sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_flag(p)
    p.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=600, help="jobs per workload")
    p.add_argument(
        "--weighted-jobs", type=int, default=1200, help="jobs of the saturated weighted run"
    )
    p.add_argument("--loads", type=float, nargs="+", default=[0.9])
    p.add_argument("--workers", type=int, default=1, help="simulations run in parallel")
    p.add_argument("--out", type=Path, default=OUT_DIR / "sweep")
    p.add_argument("--json", type=Path, help="write the numbers here")
    return p.parse_args(argv)


def workload(args: argparse.Namespace, family: str, seed: int, jobs: int) -> list[Job]:
    tenants = family_tenants(family, args.data)
    return build_workload(args.data, jobs, seed, DEFAULT_CONTEXT, DEFAULT_MAX_THINK_S, tenants)


def run_family(args: argparse.Namespace, family: str, seed: int) -> FamilyRun:
    jobs = workload(args, family, seed, args.jobs)
    config = StudyConfig(
        regimes=(gpu_regime(),),
        loads=tuple(args.loads),
        policies=POLICIES,
        seed=seed,
        workers=args.workers,
    )
    out = Study(jobs, config).run()
    calls = sum(len(j.nodes) for j in jobs)
    return FamilyRun(family, seed, len(jobs), calls, summary_json(out), check_targets(out))


def _cell(t: Target) -> str:
    if t.value is None:
        return "n/a"
    mark = "" if t.passed else " ✗"
    return f"{t.value:.3f}{mark}"


def markdown(runs: Sequence[FamilyRun], weighted: Sequence[tuple[int, WeightedShares]]) -> str:
    measured = (
        [  # targets no run of the sweep measured (the cpu knee without cpu) are left out
            k
            for k in range(len(runs[0].targets))
            if any(r.targets[k].value is not None for r in runs)
        ]
        if runs
        else []
    )
    header = ["family", "seed", "jobs"] + [runs[0].targets[k].name for k in measured]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in runs:
        cells = [r.family, str(r.seed), str(r.jobs)] + [_cell(r.targets[k]) for k in measured]
        lines.append("| " + " | ".join(cells) + " |")
    if runs:
        limits = ["", "", "limit"] + [runs[0].targets[k].limit for k in measured]
        lines.append("| " + " | ".join(limits) + " |")
    lines += ["", "| seed | policy | shares (weight share) | error | Jain of slowdowns |"]
    lines.append("|---|---|---|---|---|")
    for seed, w in weighted:
        shares = ", ".join(f"{t} {w.share[t]:.3f} ({w.weight_share[t]:.3f})" for t in w.share)
        mark = "" if w.error <= WEIGHTED_LIMIT else " ✗"
        lines.append(
            f"| {seed} | {w.policy} | {shares} | {w.error:.3f}{mark} | {w.jain_slowdown:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    runs = []
    for family in args.families:
        for seed in args.seeds:
            print(f"{family} seed {seed}", file=sys.stderr, flush=True)
            runs.append(run_family(args, family, seed))
    weighted = [
        (seed, saturated_shares(saturating, gpu_regime(), policy))
        for seed in args.seeds
        for saturating in [workload(args, "weighted", seed, args.weighted_jobs)]
        for policy in WEIGHTED_POLICIES
    ]
    command = "python -m bench.sweep " + shlex.join(sys.argv[1:] if argv is None else argv)
    report = f"`{command}`\n\n" + markdown(runs, weighted)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep.md").write_text(report, encoding="utf-8")
    if args.json is not None:
        summary = {
            "runs": [asdict(r) for r in runs],
            "weighted": [{"seed": seed} | asdict(w) for seed, w in weighted],
        }
        args.json.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(report)
    print(f"done in {time.monotonic() - started:.0f} s; outputs in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
