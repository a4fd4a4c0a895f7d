"""One backend as the settings describe it: a `[[backends]]` table of the TOML file.

No backends configured means the default: the local engine the engine settings describe. A
remote (`openai`) backend needs its URL, the model id it serves and the local HuggingFace folder
of that model's tokenizer (the gateway encodes prompts and must agree with the server token for
token; the start-up check compares them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator


class BackendSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["local", "openai"] = "local"  # the in-process engine, or a vLLM-like server
    # unique in its pool (logs, metrics, routing); default: the URL's host:port, or "local"
    name: str = ""
    url: str | None = None  # openai: the server's base URL, http(s)://host:port (no /v1)
    # the model id calls are sent for, as the server's /v1/models lists it; local: empty (the
    # engine settings' `model`)
    model: str = ""
    weight: float = Field(default=1.0, gt=0.0)  # its share of the pool's calls, relative
    api_key: SecretStr | None = None  # openai: sent as `Authorization: Bearer <key>`
    # batch slots of the server (vLLM's --max-num-seqs; servers do not export it)
    max_num_seqs: int = Field(default=256, ge=1)
    priority: bool = False  # the server schedules by priority (vLLM --scheduling-policy priority)
    tokenizer: Path | None = None  # openai: local HF folder of the served model's tokenizer
    tls_ca_file: Path | None = None  # https: trust this CA bundle instead of the system's
    tls_verify: bool = True  # https: False accepts any certificate (a test server only)
    scrape_interval_s: float = Field(default=0.2, ge=0.01, le=10.0)  # /metrics
    # /health is polled with a scrape at most this often while it answers 200, at every scrape
    # while it does not: each poll costs the server and the gateway a request
    health_interval_s: float = Field(default=1.0, ge=0.01, le=60.0)
    # a call that brings no token this long is lost (a hung server keeps its connections open,
    # and may keep them busy with keep-alive comments)
    read_timeout_s: float = Field(default=120.0, gt=0.0)
    breaker_failures: int = Field(default=5, ge=1)  # failed calls in a row that open the breaker
    breaker_cooldown_s: float = Field(default=10.0, ge=0.0)  # open this long, then one trial

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.kind == "openai":
            if self.url is None or self.tokenizer is None or not self.model:
                raise ValueError("an openai backend needs `url`, `model` and `tokenizer`")
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"url must be http(s)://host[:port], got {self.url!r}")
            if self.tls_ca_file is not None and not self.tls_verify:
                raise ValueError("tls_ca_file needs tls_verify (a CA to check nothing against)")
        elif self.url or self.api_key or self.tokenizer or self.model:
            raise ValueError("a local backend takes no `url`, `model`, `api_key` or `tokenizer`")
        return self

    @property
    def display_name(self) -> str:
        if self.name:
            return self.name
        return urlsplit(self.url).netloc if self.url else "local"
