"""A tiny copy of the shared data's layout, written by tests into a temporary folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

AGENT_ROWS: list[dict[str, Any]] = [
    # session s1: task 1 = calls 0, 1 (+ a subagent of two calls joining at call 3), 3 (end_turn)
    {
        "trace": "s1",
        "path": [],
        "idx": 0,
        "type": "n",
        "t": 0.0,
        "abs_t": 0.0,
        "in": 20_000,
        "out": 100,
        "stop": "tool_use",
        "api_time": 2.0,
        "think_time": 0.0,
    },
    {
        "trace": "s1",
        "path": [],
        "idx": 1,
        "type": "n",
        "t": 5.0,
        "abs_t": 5.0,
        "in": 40_000,
        "out": 200,
        "stop": "tool_use",
        "api_time": 3.0,
        "think_time": 3.0,
    },
    {
        "trace": "s1",
        "path": [],
        "idx": 2,
        "type": "subagent",
        "t": 9.0,
        "abs_t": 9.0,
        "n_child_requests": 2,
    },
    {
        "trace": "s1",
        "path": [2],
        "idx": 0,
        "type": "n",
        "t": 0.0,
        "abs_t": 9.0,
        "in": 10_000,
        "out": 50,
        "stop": "tool_use",
        "api_time": 1.0,
        "think_time": 0.0,
    },
    {
        "trace": "s1",
        "path": [2],
        "idx": 1,
        "type": "n",
        "t": 4.0,
        "abs_t": 13.0,
        "in": 12_000,
        "out": 60,
        "stop": "end_turn",
        "api_time": 1.0,
        "think_time": 500.0,
    },
    {
        "trace": "s1",
        "path": [],
        "idx": 3,
        "type": "n",
        "t": 30.0,
        "abs_t": 30.0,
        "in": 60_000,
        "out": 300,
        "stop": "end_turn",
        "api_time": 4.0,
        "think_time": 20.0,
    },
    # task 2: one call after the user's pause
    {
        "trace": "s1",
        "path": [],
        "idx": 4,
        "type": "n",
        "t": 900.0,
        "abs_t": 900.0,
        "in": 1_000_000,
        "out": 9_000,
        "stop": "end_turn",
        "api_time": None,
        "think_time": 860.0,
    },
]

SERVEGEN_RATES = {  # client -> (rate, cv) of its windows
    "chunk-1": [(4.0, 2.0)] * 3,
    "chunk-2": [(3.0, 1.0)] * 3,
    "chunk-3": [(2.0, 1.5)] * 3,
    "chunk-4": [(1.0, 3.0), (1.0, 1.0), (0.0, 0.0)],
    "chunk-5": [(0.5, 1.2)] * 3,
    "chunk-6": [(9.0, 1.0)],  # too few active windows to be a tenant
}


def write_data(root: Path) -> Path:
    agents = root / "agents" / "kv-cache-tester"
    agents.mkdir(parents=True)
    with (agents / "DERIVED_all_traces_nohash.jsonl").open("w") as f:
        for row in AGENT_ROWS:
            f.write(json.dumps(row) + "\n")
    azure = root / "traces" / "azure-llm-2023"
    azure.mkdir(parents=True)
    for name, rows in (("conv", [(900, 120), (300, 40)]), ("code", [(1500, 10), (200, 5)])):
        lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
        lines += [f"2023-11-16 18:00:0{i}.0,{p},{d}" for i, (p, d) in enumerate(rows)]
        (azure / f"AzureLLMInferenceTrace_{name}.csv").write_text("\n".join(lines) + "\n")
    mooncake = root / "traces" / "mooncake"
    mooncake.mkdir(parents=True)
    moon = [
        {"timestamp": 0, "input_length": 16_384 * (i + 1), "output_length": 30 + i, "hash_ids": []}
        for i in range(3)
    ]
    (mooncake / "conversation_trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in moon))
    servegen = root / "traces" / "servegen" / "data" / "language" / "m-small"
    servegen.mkdir(parents=True)
    for client, windows in SERVEGEN_RATES.items():
        lines = [f"{600 * i},{rate},{cv},Gamma,1,1" for i, (rate, cv) in enumerate(windows)]
        (servegen / f"{client}-trace.csv").write_text("\n".join(lines) + "\n")
    return root
