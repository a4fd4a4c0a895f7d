from types import SimpleNamespace

import torch

from bench.engine_speed.peers.hf_cb import kv_blocks
from bench.engine_speed.peers.protocol import KV_CACHE_GIB


def test_kv_blocks_fill_the_budget_and_no_more() -> None:
    config = SimpleNamespace(
        num_hidden_layers=30,
        num_key_value_heads=3,
        head_dim=64,
        hidden_size=576,
        num_attention_heads=9,
    )
    block_bytes = 2 * 30 * 3 * 64 * 4 * 256
    blocks = kv_blocks(config, 256, torch.float32)
    assert blocks * block_bytes <= KV_CACHE_GIB << 30 < (blocks + 1) * block_bytes
    assert kv_blocks(config, 256, torch.bfloat16) == 2 * blocks


def test_kv_blocks_derive_head_dim_when_the_config_has_none() -> None:
    config = SimpleNamespace(
        num_hidden_layers=2,
        num_key_value_heads=1,
        head_dim=None,
        hidden_size=64,
        num_attention_heads=4,
    )
    assert kv_blocks(config, 16, torch.float32) == (KV_CACHE_GIB << 30) // (2 * 2 * 16 * 4 * 16)
