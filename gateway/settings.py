"""One typed settings object, fed from flags, `FAIRGATE_*` variables or a TOML file.

Precedence: explicit values (CLI flags) > environment > TOML file (`--config` or
`FAIRGATE_CONFIG`) > defaults.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

Dtype = Literal["float32", "bfloat16"]  # the engine's weight and activation types
DTYPES: tuple[str, ...] = get_args(Dtype)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FAIRGATE_", extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=50051, ge=0, le=65535)
    store: str = "memory"  # "memory" or a redis:// URL
    admin_key: str = "fg_admin_local_dev"  # change it for anything but a local demo
    policy: str = "justitia"
    # engine
    model: str = "default"
    dtype: Dtype = "float32"
    num_threads: int | None = None
    kv_cache_mb: int = Field(default=512, ge=1)
    max_num_seqs: int = Field(default=64, ge=1)
    max_num_batched_tokens: int = Field(default=512, ge=16)
    max_model_len: int = Field(default=2048, ge=64)
    reserve_mode: Literal["none", "max", "predicted"] = "predicted"
    # calls in the engine past which justitia lets only its most urgent jobs add more (the batch
    # size where a step's cost per token stops falling; see docs/BENCHMARKS.md, fair scheduling)
    knee_calls: int | None = Field(default=None, ge=1)
    simulated_engine: bool = False  # instant synthetic tokens (gateway benchmarks)
    # calls
    # "prompt": the trained prompt model (predictor/artifacts/prompt_model.npz) predicts a call's
    # output length until its DAG node has history; "history": per-node moving averages only
    length_predictor: Literal["prompt", "history"] = "prompt"
    # predict a call's output again once it is prefilled, from the prompt's hidden state
    # (predictor/artifacts/prompt_hidden_model.npz): the policy re-keys its job and the engine
    # moves its KV reservation; an engine that hands out no hidden states (the simulated one)
    # skips it (docs/BENCHMARKS.md, predictor)
    hidden_refine: bool = True
    default_temperature: float = Field(default=0.7, ge=0.0)
    default_top_p: float = Field(default=0.9, gt=0.0, le=1.0)
    reservation_ttl_s: float = Field(default=600.0, gt=0.0)
    max_message_bytes: int = 16 * 1024 * 1024
    grace_s: float = Field(default=5.0, ge=0.0)  # graceful shutdown: time for running RPCs to end

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
