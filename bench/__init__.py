"""Benchmarks and offline research on real data; nothing here runs in the server.

Grouped by what they measure (docs/BENCHMARKS.md has every figure with its command):
`engine_speed/` the engine against its peers, online latency, KV admission and the GPU script;
`gateway_overhead` what the gateway costs per call; `sched` with `sim/`, `workloads/` and `live/`
the fair-scheduling study; `prediction/` the length predictor's labels, training and accuracy,
the latency model and the anomaly guard. `paths` resolves the data directory (docs/DATA.md).
This package imports only the standard library, so a peer engine's worker can run from its own
virtualenv.
"""

__all__: list[str] = []
