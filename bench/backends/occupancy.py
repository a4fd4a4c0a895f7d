"""How full the server was during a run: its `/metrics` gauges sampled every `INTERVAL_S`.

The mean of `vllm:num_requests_running` (the batch) and of `vllm:num_requests_waiting` (the
server's own queue) over a run says whether an arm kept the batch full and where its queue
was: in the server (direct) or in the gateway (fairgate keeps the server's near zero, so its
order is the order that runs). Sampled by `sample` until cancelled; `parse_load` is the
gateway's own reader of those gauges.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio
import httpx

from gateway.backends.server_load import parse_load

INTERVAL_S = 0.5


@dataclass(slots=True)
class Occupancy:
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)

    def means(self) -> dict[str, float]:
        n = max(len(self.running), 1)
        return {"running": sum(self.running) / n, "waiting": sum(self.waiting) / n}


async def sample(http: httpx.AsyncClient, model: str, into: Occupancy) -> None:
    while True:
        try:
            load = parse_load((await http.get("/metrics")).text, model, 0.0)
        except (httpx.HTTPError, ValueError):
            pass  # a missed sample
        else:
            into.running.append(load.running)
            into.waiting.append(load.waiting)
        await anyio.sleep(INTERVAL_S)
