"""How a tenant's prompts are encoded (`Intake.tokenize`): a one-node job's short prompt on
the event loop, every other in a worker thread, one call of the tenant's at a time.

The tenant's worker was let go while a task that had already fetched it was about to acquire it:
`to_thread.run_sync` checkpoints before it acquires the limiter, and if the tenant's running
tokenization ended in that window its `finally` saw the limiter idle and deleted it; the fetched
task then encoded under the orphaned limiter while the tenant's next tokenization made a fresh
one: two encodes of one tenant at once.
"""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import anyio
import pytest

from gateway.intake import INLINE_ENCODE_CHARS, Intake, small_blanks
from gateway.job_run import JobRun
from gateway.jobs.model import JobSpec, NodeSpec
from gateway.keyed_locks import KeyedLocks

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_tenant_tokenizes_one_call_at_a_time() -> None:
    owner = SimpleNamespace(_tokenizing=KeyedLocks())  # all `tokenize` touches on its intake
    loop = asyncio.get_running_loop()
    a_gate, c_gate, c_in, d_in = (threading.Event() for _ in range(4))
    inside, most, lock = [0], [0], threading.Lock()
    tasks: list[asyncio.Task[int]] = []

    def encoding(gate: threading.Event | None, entered: threading.Event | None) -> None:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        if entered is not None:
            entered.set()
        if gate is not None:
            gate.wait()
        with lock:
            inside[0] -= 1

    def start_c() -> None:  # another call of the tenant's is tokenized at that moment
        tasks.append(loop.create_task(Intake.tokenize(owner, "t", False, encode_c)))

    def encode_a() -> int:
        encoding(a_gate, None)
        # queued before this worker reports A's result: C's first step runs before A's end
        loop.call_soon_threadsafe(start_c)
        return 1

    def encode_c() -> int:
        encoding(c_gate, c_in)
        return 3

    def encode_d() -> int:
        encoding(None, d_in)
        return 4

    async with anyio.create_task_group() as tg:
        tg.start_soon(Intake.tokenize, owner, "t", False, encode_a)
        await anyio.wait_all_tasks_blocked()
        a_gate.set()
        await anyio.to_thread.run_sync(c_in.wait)  # C encodes now
        await anyio.wait_all_tasks_blocked()
        kept_while_c_runs = "t" in owner._tokenizing
        tg.start_soon(Intake.tokenize, owner, "t", False, encode_d)
        await anyio.wait_all_tasks_blocked()
        d_started_alongside = d_in.wait(timeout=0)
        c_gate.set()
        assert await tasks[0] == 3
    assert kept_while_c_runs, "the busy tenant's worker was let go"
    assert not d_started_alongside and most[0] == 1, f"{most[0]} of one tenant's encodes at once"


def test_only_a_one_node_job_with_a_short_prompt_is_encoded_on_the_event_loop() -> None:
    """Handing a short prompt to a worker thread costs the loop more than encoding it there;
    a long one (a short template can repeat a large input) or many prompts go to the thread."""

    def run(inputs: dict[str, str], *templates: str) -> JobRun:
        nodes = tuple(NodeSpec(id=f"n{i}", prompt_template=t) for i, t in enumerate(templates))
        return JobRun("j", "t", JobSpec(nodes=nodes, inputs=inputs), created_at=0.0)

    assert small_blanks(run({"q": "why?"}, "answer {{inputs.q}}"))
    assert not small_blanks(run({"q": "x" * 100}, "{{inputs.q}}" * 6))  # 600 characters
    assert not small_blanks(run({}, "a", "b"))
    assert small_blanks(run({}, "x" * INLINE_ENCODE_CHARS))
    assert not small_blanks(run({}, "x" * (INLINE_ENCODE_CHARS + 1)))
