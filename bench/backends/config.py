"""What one run of the backends benchmark is: its workload's size, its rounds, its servers' size.

The defaults size the whole run (both backends, three rounds of three arms, every job alone,
the capacity probe and the lone calls) to about half an hour on a busy 2-core machine; the
module docstring of `bench.backends` says why these numbers. `ARMS` are the three ways the same
jobs reach the server; round `r` runs them rotated by `r`, so a drift in the machine's speed
spreads over the arms.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.backends.settings import BackendSettings
from gateway.settings import Settings

DIRECT = "direct"
ARMS = (DIRECT, "fairgate-fcfs", "fairgate-justitia")
ADMIN_KEY = "fg_admin_bench_backends"
# the gateway reads a backend's /metrics this often: each read costs the server's API process
# (vLLM renders ~54 KB) on the cores its worker runs on; the gateway knows its own calls' room
# from their streams (a slot given back as its call ends), so the reads only correct it
SCRAPE_INTERVAL_S = 0.5
# every arm's sampling: greedy (with ignore_eos, each call generates exactly its max_tokens)
TEMPERATURE = 0.0
TOP_P: float = Settings.model_fields["default_top_p"].default


@dataclass(frozen=True, slots=True)
class BenchConfig:
    data: Path
    out: Path
    jobs: int = 60  # jobs built, before dropping those the gateway refuses for their depth
    seed: int = 6  # see the package docstring: its longest job is short beside the whole
    scale: float = 0.015  # token counts times this
    window_s: float = 10.0  # arrivals span this
    rounds: int = 3
    slots: int = 16  # batch slots of each server (vLLM --max-num-seqs), as the gateway knows
    lone_calls: int = 30  # TTFT pairs on the idle server
    fairgate_engine: bool = True  # also measure `fairgate engine serve` as the backend


def arm_order(round_: int) -> tuple[str, ...]:
    shift = round_ % len(ARMS)
    return ARMS[shift:] + ARMS[:shift]


def policy_of(arm: str) -> str:
    """The gateway policy of a fairgate arm (`fairgate-<policy>`)."""
    return arm.removeprefix("fairgate-")


def gateway_settings(policy: str, url: str, model: str, tokenizer: Path, slots: int) -> Settings:
    """A fresh in-process gateway in front of one server: greedy, every call to its max_tokens."""
    backend = BackendSettings(
        kind="openai",
        name="bench",
        url=url,
        model=model,
        tokenizer=tokenizer,
        max_num_seqs=slots,
        scrape_interval_s=SCRAPE_INTERVAL_S,
    )
    return Settings(
        port=0,
        policy=policy,
        admin_key=ADMIN_KEY,
        default_temperature=TEMPERATURE,
        default_top_p=TOP_P,
        ignore_eos=True,
        hidden_refine=False,  # an openai backend hands out no hidden states
        backends=[backend],
    )
