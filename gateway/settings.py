"""One typed settings object, fed from flags, `FAIRGATE_*` variables or a TOML file.

Precedence: explicit values (CLI flags) > environment > TOML file (`--config` or
`FAIRGATE_CONFIG`) > defaults. docs/OPERATIONS.md lists what each safety setting bounds.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from engine.errors import InvalidRequest
from engine.sampling import SamplingParams
from gateway.backends.settings import BackendSettings
from gateway.jobs import MAX_QUEUED_CHARS
from gateway.loop_budget import LOOP_SHARE
from gateway.metrics import MAX_TENANTS
from gateway.share import SLACK_CALLS
from gateway.slo import SloConfig, SloTarget

Dtype = Literal["float32", "bfloat16"]  # the engine's weight and activation types
DEFAULT_ADMIN_KEY = "fg_admin_local_dev"
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
GRPC_INT_MAX = 2**31 - 1  # gRPC's options are C ints (milliseconds, bytes)
DTYPES: tuple[str, ...] = get_args(Dtype)


class Settings(BaseSettings):
    # no setting takes inf or nan: a duration or a rate of those starts a gateway that then
    # refuses every job
    model_config = SettingsConfigDict(
        env_prefix="FAIRGATE_", extra="forbid", frozen=True, allow_inf_nan=False
    )

    host: str = "127.0.0.1"
    port: int = Field(default=50051, ge=0, le=65535)
    store: str = "memory"  # "memory" or a redis:// URL
    # the documented default works on loopback hosts only: `serve` refuses it on any other
    admin_key: str = DEFAULT_ADMIN_KEY
    policy: str = "justitia"
    # TLS: a certificate and its key turn it on; a client CA as well requires client certs (mTLS)
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    # gRPC edge: RPCs served at once (more are refused by gRPC with RESOURCE_EXHAUSTED), a
    # connection closed after this long idle, and the most jobs the gateway holds at once
    max_concurrent_rpcs: int = Field(default=4096, ge=1)
    max_connection_idle_s: float = Field(default=600.0, gt=0.0, le=GRPC_INT_MAX / 1000)
    # a connection is closed this long after it opened (then `max_connection_age_grace_s` for
    # its RPCs to end); off by default: a RunJob stream cut that way cancels its job
    max_connection_age_s: float | None = Field(default=None, gt=0.0, le=GRPC_INT_MAX / 1000)
    max_connection_age_grace_s: float = Field(default=60.0, ge=0.0, le=GRPC_INT_MAX / 1000)
    # a connection that has sent nothing for keepalive_s is pinged, and closed when no answer
    # comes within keepalive_timeout_s: a client whose host or network is lost sends no reset,
    # and its RunJob would run on (its streams held) for ever
    keepalive_s: float = Field(default=30.0, ge=0.1, le=GRPC_INT_MAX / 1000)
    keepalive_timeout_s: float = Field(default=10.0, ge=0.1, le=GRPC_INT_MAX / 1000)
    max_active_jobs: int = Field(default=10_000, ge=1)
    # a tenant's job submissions under way at once (validated, rendered and encoded one at a
    # time): more would only hold the gateway's RPC slots (`max_concurrent_rpcs`) while they wait
    max_admissions_per_tenant: int = Field(default=256, ge=1)
    # a tenant's RPCs under way at once, streams included (`QUOTA_RPCS` beyond): one tenant's
    # RPCs that wait (streams, reads in the tenant's turn) must not hold every gRPC slot
    max_rpcs_per_tenant: int = Field(default=512, ge=1)
    # the characters one tenant's admitted, unfinished jobs on this replica hold together (their
    # inputs and prompts, `gateway.jobs.job_chars`; 0: no limit): what bounds one tenant's
    # share of the gateway's memory, at about 3 bytes a character
    max_queued_chars_per_tenant: int = Field(default=MAX_QUEUED_CHARS, ge=0)
    auth_failures_per_minute: int = Field(default=30, ge=1)  # per peer address
    # the share of the event loop one tenant's requests may take to parse, convert and validate,
    # over any 20 s beyond one request (`gateway.loop_budget`): past it the tenant waits, others
    # go on
    max_loop_share_per_tenant: float = Field(default=LOOP_SHARE, gt=0, le=1)
    # Prometheus /metrics over HTTP on this port (0: any free one); off when unset. Bound to
    # metrics_host, loopback unless said otherwise: never a tenant-facing port
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    # tenants named in metric labels (the first seen; later ones are `_other`)
    metrics_max_tenants: int = Field(default=MAX_TENANTS, ge=1)
    # quota closes that could not reach the store wait here (a redis store only; default
    # ~/.local/state/fairgate/outbox-<port>.jsonl)
    outbox_file: Path | None = None
    # how long a call's reserve retries an unreachable store before its node fails
    reserve_deadline_s: float = Field(default=30.0, gt=0.0)
    # a new job that needs a pool none of whose backends has served for this long is refused
    # (UNAVAILABLE, BACKENDS_UNAVAILABLE); jobs admitted before wait for a backend to return
    pool_down_after_s: float = Field(default=10.0, ge=0.0)
    max_prompt_chars: int = Field(default=262_144, ge=1)  # a rendered prompt, before tokens
    retained_jobs_per_tenant: int = Field(default=1000, ge=1)  # ended jobs kept for GetJob
    # ... and the most they hold (their specs' text, outputs and token deltas), oldest dropped
    retained_bytes_per_tenant: int = Field(default=64 << 20, ge=1)
    prefix_cache_per_tenant: bool = False  # tenants never share prefix-cache blocks
    # engine
    model: str = "default"
    dtype: Dtype = "float32"
    num_threads: int | None = None
    kv_cache_mb: int = Field(default=512, ge=1)
    max_num_seqs: int = Field(default=64, ge=1)
    max_num_batched_tokens: int = Field(default=512, ge=16)
    max_model_len: int = Field(default=2048, ge=64)
    reserve_mode: Literal["none", "max", "predicted"] = "predicted"
    # calls in a backend past which justitia lets only its most urgent jobs add more (the batch
    # size where a step's cost per token stops falling; see docs/BENCHMARKS.md, fair scheduling),
    # or "auto": where the local engine's throughput reaches 80 % of its full batch's, by a step
    # model fitted to its own steps (no knee on a backend that measures none)
    knee_calls: Annotated[int, Field(ge=1)] | Literal["auto"] | None = None
    # keep each tenant's weighted share of the backends' slots, not only a fair order: a call of
    # a tenant under its share that waits for room takes the slot of the newest call of a tenant
    # over its share, which runs again from its prompt (gateway/dispatch_core.py)
    share_slots: bool = False
    simulated_engine: bool = False  # instant synthetic tokens (gateway benchmarks)
    # the simulated engine's steps take this long on the wall clock (0: instant), so calls last
    # as long as a real engine's would
    simulated_step_s: float = Field(default=0.0, ge=0.0, le=10.0)
    # calls
    # "prompt": the trained prompt model (predictor/artifacts/prompt_model.npz) predicts a call's
    # output length, corrected online per tenant and node; "history": per-node moving averages
    length_predictor: Literal["prompt", "history"] = "prompt"
    # predict a call's output again once it is prefilled, from the prompt's hidden state
    # (predictor/artifacts/prompt_hidden_model.npz): the policy re-keys its job and the engine
    # moves its KV reservation; an engine that hands out no hidden states (the simulated one)
    # skips it (docs/BENCHMARKS.md, predictor)
    hidden_refine: bool = True
    default_temperature: float = Field(default=0.7, ge=0.0)
    default_top_p: float = Field(default=0.9, gt=0.0, le=1.0)
    # overload control (gateway/slo.py, docs/OPERATIONS.md): latency targets per tenant id or
    # "*" ({tenant, ttft_s, tpot_s}; ttft counted from ready); none: off. Past `slo_threshold`
    # of calls missing them over `slo_window_s`, sheddable work is held, then the batch shrunk,
    # then new jobs refused, a step up at most every `slo_rise_s`; undone as the misses fall,
    # a step down at most every `slo_hold_s`
    slo_targets: list[SloTarget] = []
    slo_window_s: float = Field(default=10.0, gt=0.0)
    slo_threshold: float = Field(default=0.1, gt=0.0, lt=1.0)
    slo_min_calls: int = Field(default=20, ge=1)
    slo_hold_s: float = Field(default=2.0, ge=0.0)
    slo_rise_s: float = Field(default=0.25, ge=0.0)
    # benchmarks only: every call runs to its max_tokens (end-of-sequence ignored), so that runs
    # compared with each other generate the same tokens
    ignore_eos: bool = False
    # lease of a call's quota reservation and of an admitted job; renewed every third of it
    # while they run, so a crashed gateway holds a tenant's quota for at most this long
    reservation_ttl_s: float = Field(default=60.0, gt=0.0)
    max_message_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, le=GRPC_INT_MAX)
    grace_s: float = Field(default=5.0, ge=0.0)  # graceful shutdown: time for running RPCs to end
    # replicas (a redis store only, docs/REPLICAS.md): this gateway's name in job ownership
    # (empty: host and pid), how long an owned job's lease lasts unrenewed (a dead replica's
    # jobs are taken over after it), and how long an ended job stays readable in the journal
    replica_id: str = Field(default="", max_length=128)
    lease_ttl_s: float = Field(default=10.0, ge=0.5)
    job_retention_s: float = Field(default=86_400.0, ge=60.0)
    # the pool's order across replicas (gateway/share.py): how far, in mean calls' cost, a
    # tenant may lead the least-served tenant waiting anywhere in the pool (vtc, justitia; fcfs
    # and las charge nothing, so they lead by nothing)
    share_slack_calls: float = Field(default=SLACK_CALLS, ge=0.0)
    # benchmarks only: each replica orders only the jobs it owns, as before the pool's order
    # (`fairgate bench replicas` measures the error this makes)
    per_replica_share: bool = False
    # where calls run: `[[backends]]` tables in the TOML (gateway/backends/settings.py); none:
    # the local engine the engine settings above describe
    backends: list[BackendSettings] = []

    @model_validator(mode="after")
    def _coherent(self) -> Settings:
        if self.store != "memory" and not self.store.startswith(REDIS_SCHEMES):
            raise ValueError(f"store must be 'memory' or a redis:// URL, got {self.store!r}")
        try:  # the engine's own rule for what a call names
            SamplingParams(temperature=self.default_temperature, top_p=self.default_top_p)
        except InvalidRequest as exc:
            raise ValueError(f"default_temperature, default_top_p: {exc}") from None
        if self.metrics_port is not None and self.metrics_port == self.port != 0:
            raise ValueError(f"metrics_port {self.metrics_port} is the gRPC port")
        return self

    def replica(self) -> str:
        return self.replica_id or f"{socket.gethostname()}-{os.getpid()}"

    def slo(self) -> SloConfig | None:
        """The overload control's settings; None without targets."""
        if not self.slo_targets:
            return None
        return SloConfig(
            tuple(self.slo_targets),
            self.slo_window_s,
            self.slo_threshold,
            self.slo_min_calls,
            self.slo_hold_s,
            self.slo_rise_s,
        )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = os.environ.get("FAIRGATE_CONFIG")
        if path:
            if not Path(path).is_file():  # a typo would start a gateway on the defaults
                raise FileNotFoundError(f"config file not found (FAIRGATE_CONFIG): {path}")
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(path)))
        return tuple(sources)


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Settings from a TOML file (optional), the environment and explicit overrides."""
    explicit = {k: v for k, v in overrides.items() if v is not None}
    if config_file is None:
        return Settings(**explicit)
    if not config_file.is_file():
        raise FileNotFoundError(f"config file not found: {config_file}")
    previous = os.environ.get("FAIRGATE_CONFIG")
    os.environ["FAIRGATE_CONFIG"] = str(config_file)
    try:
        return Settings(**explicit)
    finally:
        if previous is None:
            del os.environ["FAIRGATE_CONFIG"]
        else:
            os.environ["FAIRGATE_CONFIG"] = previous
