"""The model runner: executes one StepPlan on the real model and answers with a StepOutput.

Algorithm: load the checkpoint with transformers, keep its weights in a `PagedDecoder`, allocate
the KV pool, and per step pack the plan (`build_step_batch`), run the decoder once over all the
step's tokens, project to logits only the last row of each sequence that samples, and sample. A
sequence that wants its hidden state gets, on its sampling chunk, its last row of the residual
stream after `hidden_layer` blocks (engine/hidden.py). Invariant: the runner keeps no
per-request state.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PretrainedConfig

from engine.attention import PagedAttention, StepBatch, build_step_batch
from engine.config import EngineConfig
from engine.cpu_kernels import load_cpu_kernels
from engine.errors import UnsupportedModel
from engine.hidden import LayerTap, hidden_layer
from engine.kv_cache import KVCache, head_dim_of
from engine.kv_cache import kv_bytes_per_block as _kv_bytes_per_block
from engine.model import PagedDecoder
from engine.plan import StepOutput, StepPlan
from engine.row_ops import TorchRowOps
from engine.sampler import Sampler

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise UnsupportedModel(f"dtype {name!r}; supported: {sorted(DTYPES)}")
    return DTYPES[name]


class ModelRunner:
    def __init__(self, path: Path, config: EngineConfig, num_blocks: int) -> None:
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype)
        if self.device.type == "cpu" and config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype)
        torch.nn.Module.to(hf_model, self.device)
        self.model_config: PretrainedConfig = hf_model.config
        self.block_size = config.block_size
        positions = int(self.model_config.max_position_embeddings)
        if config.max_model_len > positions:  # a step past its position table reads outside it
            raise UnsupportedModel(
                f"max_model_len {config.max_model_len} is past the model's {positions} positions"
            )
        self.max_model_len = config.max_model_len
        self.vocab_size = int(hf_model.lm_head.weight.shape[0])
        self.hidden_size = int(self.model_config.hidden_size)
        self.hidden_layer = hidden_layer(int(self.model_config.num_hidden_layers))
        self.eos_token_ids = _eos_token_ids(self.model_config, hf_model.generation_config)
        kernels = load_cpu_kernels() if self.device.type == "cpu" else None
        with torch.inference_mode():
            ops = TorchRowOps() if kernels is None else kernels
            self.decoder = PagedDecoder(hf_model, self.max_model_len, ops)
        cache = KVCache(
            num_layers=int(self.model_config.num_hidden_layers),
            num_blocks=num_blocks,
            block_size=config.block_size,
            kv_heads=int(self.model_config.num_key_value_heads),
            head_dim=head_dim_of(self.model_config),
            dtype=self.dtype,
            device=self.device,
        )
        self.attention = PagedAttention(
            cache, self.decoder.num_heads, self.decoder.head_dim, kernels
        )
        self.sampler = (
            Sampler(eos_token_ids=self.eos_token_ids)
            if kernels is None
            else Sampler(argmax=kernels.argmax, eos_token_ids=self.eos_token_ids)
        )

    @staticmethod
    def kv_bytes_per_block(
        model_config: PretrainedConfig, block_size: int, dtype: torch.dtype | str
    ) -> int:
        return _kv_bytes_per_block(model_config, block_size, dtype)

    @classmethod
    def positions(cls, path: Path) -> int:
        """The longest sequence the checkpoint at `path` can run: its position table."""
        return int(AutoConfig.from_pretrained(path).max_position_embeddings)

    @classmethod
    def num_blocks_for(cls, path: Path, config: EngineConfig) -> int:
        """How many KV blocks `config.kv_cache_bytes` buys for the checkpoint at `path`."""
        model_config = AutoConfig.from_pretrained(path)
        per_block = cls.kv_bytes_per_block(model_config, config.block_size, config.dtype)
        return max(1, config.kv_cache_bytes // per_block)

    def execute(self, plan: StepPlan) -> StepOutput:
        started = time.perf_counter()
        if plan.is_empty:
            return StepOutput(sampled={}, elapsed_s=time.perf_counter() - started)
        with torch.inference_mode():
            batch = build_step_batch(plan.seqs, self.block_size, self.device)
            wanting, tap = self._tap(plan, batch)
            hidden = self.decoder.forward(batch, self.attention, tap)
            output = StepOutput(sampled=self._sample(plan, batch, hidden))
            if tap is not None and tap.states is not None:
                output.hidden = dict(zip(wanting, tap.states.float().cpu().tolist(), strict=True))
        output.elapsed_s = time.perf_counter() - started
        return output

    def _tap(self, plan: StepPlan, batch: StepBatch) -> tuple[list[str], LayerTap | None]:
        """The sequences that want their hidden state now (on their sampling chunk) and a tap
        on their last rows."""
        picked = [
            (plan.seqs[i].request_id, batch.last_rows[j])
            for j, i in enumerate(batch.seq_order)
            if plan.seqs[i].want_hidden and plan.seqs[i].sample
        ]
        if not picked:
            return [], None
        rows = torch.tensor([row for _, row in picked], device=self.device)
        return [request_id for request_id, _ in picked], LayerTap(self.hidden_layer, rows)

    def _sample(self, plan: StepPlan, batch: StepBatch, hidden: torch.Tensor) -> dict[str, int]:
        packed = [j for j, i in enumerate(batch.seq_order) if plan.seqs[i].sample]
        if not packed:
            return {}
        seqs = [plan.seqs[batch.seq_order[j]] for j in packed]
        rows = torch.tensor([batch.last_rows[j] for j in packed], device=self.device)
        logits = self.decoder.logits(hidden[rows])
        tokens = self.sampler(logits, [s.params for s in seqs], [s.num_output_tokens for s in seqs])
        return {s.request_id: t for s, t in zip(seqs, tokens, strict=True)}


def _eos_token_ids(config: PretrainedConfig, generation: GenerationConfig | None) -> frozenset[int]:
    ids: set[int] = set()
    for source in (config, generation):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return frozenset(ids)
