"""The study as Markdown: setup, headline table, where the JCT goes, grid, extras and targets.

Tables are built from the outcomes only: for the headline point one row per policy (oracle and
noisy average JCT, p99, throughput, bound violations, worst slowdown over tenants, Jain's index
of the tenants' mean slowdowns, mean queueing delay), then its JCT split into think delays and
service of the jobs alone and queueing, with the zero-queueing floor of the headline ratios (no
order beats the jobs' solo JCT); for the grid one row per regime, load and policy. Invariant:
every number printed is in the details JSON too.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.sim.study import NO_KNEE, NOISY, ORACLE, StudyResult
from bench.sim.summary import Target, attack_slowdown, cell_outcomes, knee_ratios
from bench.sim.targets import check_targets


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _f(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def setup_lines(out: StudyResult) -> list[str]:
    lines = []
    for name, p in out.prepared.items():
        config = p.setup.config
        model = p.regime.step_model
        lines.append(
            f"- `{name}`: step = {model.overhead_s * 1e3:.3g} ms + {model.per_token_s * 1e6:.3g} µs"
            f"/token + {model.per_context_token_s * 1e9:.3g} ns/context token + "
            f"{model.per_prefill_pair_s * 1e9:.3g} ns/prefill pair; KV "
            f"{(config.num_blocks or 0) * config.block_size:,} tokens, {config.max_num_seqs} seqs, "
            f"{config.max_num_batched_tokens} tokens/step; knee {p.setup.knee_calls}; measured "
            f"capacity {p.capacity:,.0f} KV token-slots per {p.step_seconds * 1e3:.1f} ms step"
        )
    for (regime, load), delta in sorted(out.delta.items()):
        lines.append(f"- Δ ({regime}, load {load}) = {delta:.1f} s")
    return lines


def headline_lines(out: StudyResult) -> list[str]:
    regime, load = out.config.headline
    head = cell_outcomes(out, regime, load, ORACLE)
    noisy = cell_outcomes(out, regime, load, NOISY)
    rows = []
    for policy, o in head.items():
        m = o.metrics
        rows.append(
            [
                policy,
                _f(m.avg_jct),
                _f(noisy[policy].metrics.avg_jct if policy in noisy else None),
                _f(m.p99_jct),
                _f(m.throughput, 0),
                str(m.bound_violations),
                _f(max(m.worst_slowdown.values()), 2),
                _f(m.jain_slowdown, 3),
                _f(m.avg_queueing),
            ]
        )
    header = [
        "policy",
        "avg JCT s",
        "noisy avg JCT s",
        "p99 JCT s",
        "tokens/s",
        "bound violations",
        "worst slowdown",
        "Jain",
        "avg queueing s",
    ]
    return [f"### Headline: {regime}, load {load}", "", *_table(header, rows)]


def _share(part: float, whole: float) -> str:
    return f"{part:,.1f} ({part / whole:.0%})"


def breakdown_lines(out: StudyResult) -> list[str]:
    regime, load = out.config.headline
    head = cell_outcomes(out, regime, load, ORACLE)
    if not head:
        return []
    rows = []
    for policy, o in head.items():
        m = o.metrics
        service = m.avg_solo_jct - m.avg_solo_think
        rows.append(
            [
                policy,
                _f(m.avg_jct),
                _share(m.avg_solo_think, m.avg_jct),
                _share(service, m.avg_jct),
                _share(m.avg_queueing, m.avg_jct),
            ]
        )
    header = ["policy", "avg JCT s", "think (alone) s", "service (alone) s", "queueing s"]
    floor = next(iter(head.values())).metrics.avg_solo_jct
    reach = [
        f"- zero-queueing floor: avg JCT >= {floor:,.1f} s (the mean solo JCT) under any order, "
        "so justitia / "
        + ", justitia / ".join(
            f"{p} >= {floor / head[p].metrics.avg_jct:.3f}" for p in ("vtc", "fcfs") if p in head
        )
    ]
    title = f"### Where the JCT goes: {regime}, load {load}"
    return [title, "", *_table(header, rows), "", *reach]


def grid_lines(out: StudyResult) -> list[str]:
    rows = []
    for key, o in out.outcomes.items():
        regime, load, variant, policy = key
        if variant not in (ORACLE, NO_KNEE):
            continue
        m = o.metrics
        name = policy if variant == ORACLE else f"{policy} (no knee)"
        worst = max(m.worst_slowdown, key=m.worst_slowdown.__getitem__)
        rows.append(
            [
                regime,
                str(load),
                name,
                _f(m.avg_jct),
                _f(m.p99_jct),
                _f(m.throughput, 0),
                str(m.bound_violations),
                f"{m.worst_slowdown[worst]:.2f} ({worst})",
                _f(m.jain_slowdown, 3),
                _f(m.avg_queueing),
                str(m.preemptions),
            ]
        )
    header = [
        "regime",
        "load",
        "policy",
        "avg JCT s",
        "p99 JCT s",
        "tokens/s",
        "violations",
        "worst slowdown (tenant)",
        "Jain",
        "avg queueing s",
        "preemptions",
    ]
    return ["### Grid", "", *_table(header, rows)]


def target_lines(targets: Sequence[Target]) -> list[str]:
    mark = {True: "pass", False: "FAIL", None: "not run"}
    rows = [[t.name, _f(t.value, 3), t.limit, mark[t.passed]] for t in targets]
    return ["### Targets", "", *_table(["target", "value", "limit", ""], rows)]


def markdown(out: StudyResult, command: str) -> str:
    knee = knee_ratios(out, NO_KNEE) or {}
    extras = [
        f"- Attack (justitia): honest tenants' avg JCT slowdown {_f(attack_slowdown(out), 3)}",
        "- cpu knee point without the knee: justitia / fcfs avg JCT "
        f"{_f(knee.get('avg_jct_vs_fcfs'), 3)}, throughput "
        f"{_f(knee.get('throughput_vs_fcfs'), 3)}",
    ]
    lines = [
        "## Fair scheduling study",
        "",
        f"`{command}`",
        "",
        *setup_lines(out),
        "",
        *headline_lines(out),
        "",
        *breakdown_lines(out),
        "",
        *grid_lines(out),
        "",
        *extras,
        "",
        *target_lines(check_targets(out)),
        "",
    ]
    return "\n".join(lines)
