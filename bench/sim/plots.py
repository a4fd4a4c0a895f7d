"""PNG plots of the headline point: cumulative service per tenant over time, and JCT CDFs.

Service is the KV token-time each tenant received, from the snapshots the headline runs record;
one panel per policy, log-scaled. The CDF plot has one line per policy (log-scaled JCT).
Invariant: the plots only read outcomes; matplotlib runs headless (Agg).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from bench.sim.study import ORACLE, StudyResult
from bench.sim.summary import cell_outcomes


def plot_service(out: StudyResult, path: Path) -> None:
    regime, load = out.config.headline
    cell = cell_outcomes(out, regime, load, ORACLE)
    if not cell:
        return
    cols = min(3, len(cell))
    rows = math.ceil(len(cell) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.5 * rows), squeeze=False)
    for ax, (policy, o) in zip(axes.flat, cell.items(), strict=False):
        tenants = sorted({t for _, served in o.result.service for t in served})
        times = [t for t, _ in o.result.service]
        for tenant in tenants:
            served = [max(s.get(tenant, 0.0), 1.0) for _, s in o.result.service]
            ax.plot(times, served, label=tenant)
        ax.set_yscale("log")  # the heavy tenant's service dwarfs the light ones'
        ax.set_title(policy)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("cumulative KV token-time")
    for ax in axes.flat[len(cell) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize="small")
    fig.suptitle(f"Cumulative service per tenant ({regime}, load {load})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_jct_cdf(out: StudyResult, path: Path) -> None:
    regime, load = out.config.headline
    cell = cell_outcomes(out, regime, load, ORACLE)
    if not cell:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, o in cell.items():
        jct = np.sort([o.result.finish[j.job_id] - j.arrival for j in o.jobs])
        ax.plot(jct, np.arange(1, len(jct) + 1) / len(jct), label=policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(f"JCT CDF ({regime}, load {load})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
