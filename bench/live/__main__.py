"""`python -m bench.live`: the live check of the fair-scheduling study (see `check.py`).

On a machine shared with other work, give it the CPU first (it measures wall time):

    nice -n -10 python -m bench.live --json bench/out/sched-live/live.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.live.check import LiveConfig, run_check
from bench.paths import OUT_DIR, add_data_flag
from tenants.policies import POLICY_NAMES


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.live", description=__doc__)
    add_data_flag(p)
    p.add_argument("--out", type=Path, default=OUT_DIR / "sched-live")
    p.add_argument("--json", type=Path, help="default: OUT/live.json")
    p.add_argument("--jobs", type=int, help="jobs built, before dropping deep ones (40)")
    p.add_argument("--seed", type=int)
    p.add_argument("--scale", type=float, help="token counts times this (0.03)")
    p.add_argument("--window-s", type=float, help="arrivals span this (5 s)")
    p.add_argument("--kv-cache-mb", type=int, help="the live engine's KV pool (1 MB)")
    p.add_argument("--policies", nargs="+", choices=POLICY_NAMES)
    p.add_argument("--repeats", type=int, help="live runs of each policy (3)")
    return p.parse_args(argv)


def config_of(args: argparse.Namespace) -> LiveConfig:
    names = ("jobs", "seed", "scale", "window_s", "kv_cache_mb", "policies", "repeats")
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if "policies" in given:
        given["policies"] = tuple(given["policies"])
    return LiveConfig(args.data, args.out, **given)


def table(result: dict[str, Any]) -> str:
    lines = [
        "| policy | live avg JCT s (runs) | simulated s | live steps (runs) | simulated steps |",
        "|---|---|---|---|---|",
    ]
    for policy, sim in result["sim"].items():
        live = result["live"].get(policy)
        seconds = steps = "not run live"
        if live:
            seconds = f"{live['avg_jct']:.2f} ({_runs(live['runs_avg_jct'], 2)})"
            steps = f"{live['avg_jct_steps']:.0f} ({_runs(live['runs_avg_jct_steps'], 0)})"
        simulated = f"{sim['avg_jct']:.2f} | {steps} | {sim['avg_jct_steps']:.0f}"
        lines.append(f"| {policy} | {seconds} | {simulated} |")
    lines.append("")
    for unit, key in (("seconds", "ranking"), ("steps", "ranking_steps")):
        rank = result[key]
        lines.append(
            f"- {unit}: live {' < '.join(rank['live'])}; simulated {' < '.join(rank['sim'])}; "
            f"same: {rank['same']}; Kendall's tau {rank['kendall_tau']}"
        )
    return "\n".join(lines)


def _runs(values: list[float], digits: int) -> str:
    return ", ".join(f"{v:.{digits}f}" for v in values)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    config = config_of(args)
    started = time.monotonic()
    result = run_check(config, log=lambda line: print(line, file=sys.stderr, flush=True))
    result["command"] = "python -m bench.live " + shlex.join(sys.argv[1:] if argv is None else argv)
    result["wall_s"] = time.monotonic() - started
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.json or args.out / "live.json"
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(table(result))
    print(f"done in {result['wall_s']:.0f} s; JSON in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
