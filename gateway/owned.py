"""A base for objects that own background tasks: an async context manager with `aclose()`.

Entering opens what the subclass needs (`_open`, on an exit stack closed in reverse order),
then one task group in which `_start_tasks` launches the subclass's tasks; leaving, or `aclose()`,
cancels the group and closes everything that was opened; so does a failure while entering.
Nothing outlives the owner.
"""

from __future__ import annotations

import contextlib
from typing import Self

import anyio
from anyio.abc import TaskGroup


class OwnsTasks:
    def __init__(self) -> None:
        self._tg: TaskGroup | None = None
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Self:
        try:
            await self._open(self._stack)
            self._tg = await self._stack.enter_async_context(anyio.create_task_group())
            self._start_tasks(self._tg)
        except BaseException:  # what was opened before the failure is closed again
            with anyio.CancelScope(shield=True):
                await self._stack.aclose()
            self._tg = None
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
            await self._stack.aclose()
            self._tg = None

    async def _open(self, stack: contextlib.AsyncExitStack) -> None:
        """Open what the tasks need; the default opens nothing."""

    def _start_tasks(self, tg: TaskGroup) -> None:
        raise NotImplementedError

    @property
    def tasks(self) -> TaskGroup:
        """The task group, for tasks started while the owner runs."""
        assert self._tg is not None, "not entered"
        return self._tg
