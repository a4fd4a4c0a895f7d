"""Values under (owner, name) keys, each owner's names in an LRU order of their own.

Past `max_per_owner`, an owner's least recently used name is dropped, never another owner's: one
tenant inventing node names (a name is free text) cannot evict what the other tenants' calls
taught the predictor. Owners (the tenants, and '' for what is learned across them) are kept in
LRU order too and the least recently used is dropped whole past `max_owners` (a deleted tenant's
names go in time). Invariant: at most `max_owners` owners of at most `max_per_owner` names each.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")


class OwnedLru(Generic[V]):
    def __init__(self, max_per_owner: int, max_owners: int = 10_000) -> None:
        if max_per_owner < 1 or max_owners < 1:
            raise ValueError(f"need max_per_owner, max_owners >= 1: {max_per_owner}, {max_owners}")
        self.max_per_owner, self.max_owners = max_per_owner, max_owners
        self._owners: OrderedDict[str, OrderedDict[str, V]] = OrderedDict()

    def get(self, key: tuple[str, str]) -> V | None:
        """The value, if kept; reading does not count as a use."""
        names = self._owners.get(key[0])
        return None if names is None else names.get(key[1])

    def put(self, key: tuple[str, str], value: V) -> None:
        """Keep `value` as the owner's most recently used name (dropping its oldest past the
        limit, and the least recently used owner past theirs)."""
        owner, name = key
        names = self._owners.get(owner)
        if names is None:
            names = self._owners[owner] = OrderedDict()
            if len(self._owners) > self.max_owners:
                self._owners.popitem(last=False)
        else:
            self._owners.move_to_end(owner)
        names[name] = value
        names.move_to_end(name)
        if len(names) > self.max_per_owner:
            names.popitem(last=False)

    def __len__(self) -> int:
        return sum(len(names) for names in self._owners.values())
