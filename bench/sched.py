"""`fairgate bench sched`: the fair-scheduling study (docs/BENCHMARKS.md, "Fair scheduling").

Builds the workload from the real data (or reads `--workload FILE`), then runs every policy on
the same jobs in each engine regime (`cpu`, `gpu`) and load, through the real engine core with
the simulated runner (`bench.sim`), plus the noisy-prediction, attack and knee runs. Writes the
issue's JSON (`--json`), and into `--out` a Markdown report, the details of every run, the base
workload and PNG plots. `--quick` runs a smaller grid (fewer jobs, load 0.9 only).
`--share-slots` runs every policy with the gateway's `share_slots` (yields to under-share
tenants, and the knee holding the batch while a light tenant runs).

    python -m bench.sched --quick --json sched.json
    fairgate bench sched --workload my.jsonl --regimes gpu --loads 0.9
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.paths import OUT_DIR, add_data_flag
from bench.sim.plots import plot_jct_cdf, plot_service
from bench.sim.regime import CPU_STEP_MODEL, Regime, cpu_regime, gpu_regime, load_step_model
from bench.sim.report import markdown
from bench.sim.study import Study, StudyConfig, StudyResult
from bench.sim.summary import summary_json
from bench.sim.targets import check_targets
from bench.workloads.build import DEFAULT_CONTEXT, DEFAULT_MAX_THINK_S, build_workload
from bench.workloads.families import FAMILIES, family_tenants
from bench.workloads.format import Job, read_workload, write_workload
from tenants.policies import POLICY_NAMES

DEFAULT_OUT = OUT_DIR / "sched"
FULL_JOBS, QUICK_JOBS = 600, 150


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="fairgate bench sched",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_flag(p)
    p.add_argument("--workload", type=Path, help="a JSONL workload (docs/WORKLOADS.md)")
    p.add_argument(
        "--family", choices=list(FAMILIES), default="servegen", help="the tenants to build"
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--json", type=Path, help="write the summary JSON here")
    p.add_argument("--quick", action="store_true", help="a smaller grid, under 5 minutes")
    p.add_argument("--jobs", type=int, help=f"jobs to build ({FULL_JOBS}; quick {QUICK_JOBS})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--context", type=int, default=DEFAULT_CONTEXT)
    p.add_argument("--max-think-s", type=float, default=DEFAULT_MAX_THINK_S)
    p.add_argument("--loads", type=float, nargs="+", help="(0.7 0.9 1.1; quick 0.9)")
    p.add_argument("--regimes", nargs="+", choices=["cpu", "gpu"], default=["cpu", "gpu"])
    p.add_argument("--policies", nargs="+", choices=POLICY_NAMES, default=list(POLICY_NAMES))
    p.add_argument("--attack-policies", nargs="+", choices=POLICY_NAMES, default=["justitia"])
    p.add_argument("--cpu-step-model", type=Path, help="JSON: overhead_s, per_token_s, ...")
    p.add_argument("--noise-sigma", type=float, default=0.4)
    p.add_argument("--workers", type=int, default=1, help="simulations run in parallel")
    p.add_argument(
        "--share-slots",
        action="store_true",
        help="the gateway's share_slots: yields to under-share tenants, the knee held for light",
    )
    return p.parse_args(argv)


def regimes(args: argparse.Namespace) -> tuple[Regime, ...]:
    cpu_model = load_step_model(args.cpu_step_model) if args.cpu_step_model else CPU_STEP_MODEL
    made = {"cpu": cpu_regime(cpu_model), "gpu": gpu_regime()}
    return tuple(made[name] for name in args.regimes)


def base_workload(args: argparse.Namespace) -> list[Job]:
    if args.workload is not None:
        return read_workload(args.workload)
    jobs = args.jobs or (QUICK_JOBS if args.quick else FULL_JOBS)
    tenants = family_tenants(args.family, args.data)
    return build_workload(args.data, jobs, args.seed, args.context, args.max_think_s, tenants)


def details_json(out: StudyResult) -> dict[str, Any]:
    return {
        "prepared": {
            name: {
                "capacity": p.capacity,
                "step_seconds": p.step_seconds,
                "knee_calls": p.setup.knee_calls,
                "num_blocks": p.setup.config.num_blocks,
                "context": p.context,
            }
            for name, p in out.prepared.items()
        },
        "delta": [{"regime": r, "load": load, "delta_s": d} for (r, load), d in out.delta.items()],
        "runs": [
            {
                "regime": k[0],
                "load": k[1],
                "variant": k[2],
                "policy": k[3],
                "steps": o.result.steps,
                "output_tokens": o.result.output_tokens,
            }
            | o.metrics.to_json()
            for k, o in out.outcomes.items()
        ],
        "targets": [asdict(t) for t in check_targets(out)],
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    jobs = base_workload(args)
    loads = tuple(args.loads or ((0.9,) if args.quick else (0.7, 0.9, 1.1)))
    config = StudyConfig(
        regimes=regimes(args),
        loads=loads,
        policies=tuple(args.policies),
        attack_policies=tuple(args.attack_policies),
        noise_sigma=args.noise_sigma,
        seed=args.seed,
        workers=args.workers,
        share_slots=args.share_slots,
    )
    out = Study(jobs, config).run()
    args.out.mkdir(parents=True, exist_ok=True)
    write_workload(args.out / "workload.jsonl", jobs)
    command = "python -m bench.sched " + shlex.join(sys.argv[1:] if argv is None else argv)
    report = markdown(out, command)
    (args.out / "results.md").write_text(report, encoding="utf-8")
    (args.out / "details.json").write_text(json.dumps(details_json(out), indent=1) + "\n")
    plot_service(out, args.out / "service.png")
    plot_jct_cdf(out, args.out / "jct_cdf.png")
    if args.json is not None:
        args.json.write_text(json.dumps(summary_json(out), indent=1) + "\n", encoding="utf-8")
    print(report)
    print(f"done in {time.monotonic() - started:.0f} s; outputs in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
