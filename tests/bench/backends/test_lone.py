"""Lone calls against a real engine server app (the simulated engine): each call's three TTFTs."""

from pathlib import Path

import httpx
import pytest

from bench.backends.config import gateway_settings
from bench.backends.lone import ttft_pairs
from bench.backends.workload import PlannedCall, PlannedJob, Workload
from bench.workloads.format import Job, Node
from gateway.jobs.model import JobSpec, NodeSpec
from tests.gateway.backends.conftest import MODEL, remote
from tests.gateway.engine_servers import model_folder

pytestmark = pytest.mark.anyio
STEP_S = 0.05  # each engine step: the server's part of a TTFT is at least one


def one_call(i: int) -> PlannedJob:
    call = PlannedCall("n", (), f"say something, {i}", (5, 6, 7, 8), 2)
    job = Job(f"j{i}", "ab"[i % 2], 1.0, 0.0, "one", (Node("n", (), 4, 2, 2),))
    return PlannedJob(job, JobSpec(nodes=(NodeSpec(id="n", prompt_template=call.text),)), (call,))


async def test_each_lone_call_has_the_servers_part_of_its_ttft_through_fairgate(
    tmp_path: Path,
) -> None:
    workload = Workload(tuple(one_call(i) for i in range(4)), ceiling=8, dropped=0)
    async with remote(STEP_S) as server, httpx.AsyncClient(base_url=server.url) as http:
        settings = gateway_settings("justitia", server.url, MODEL, model_folder(tmp_path), 8)
        calls = await ttft_pairs(http, MODEL, settings, workload, 3)
    assert len(calls) == 3  # the first pair only warmed the paths
    for call in calls:
        assert call.direct >= STEP_S and STEP_S <= call.server < call.fairgate
