"""Values under (owner, name) keys, each owner's names in an LRU order of their own.

Past `max_per_owner`, an owner's least recently used name is dropped, never another owner's: one
tenant inventing node names (a name is free text) cannot evict what the other tenants' calls
taught the predictor. Owners are the tenants (and '' for what is learned across them), made by
operators, so they are never dropped. Invariant: no owner holds more than `max_per_owner` names.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")


class OwnedLru(Generic[V]):
    def __init__(self, max_per_owner: int) -> None:
        if max_per_owner < 1:
            raise ValueError(f"max_per_owner must be >= 1, got {max_per_owner}")
        self.max_per_owner = max_per_owner
        self._owners: dict[str, OrderedDict[str, V]] = {}

    def get(self, key: tuple[str, str]) -> V | None:
        """The value, if kept; reading does not count as a use."""
        names = self._owners.get(key[0])
        return None if names is None else names.get(key[1])

    def put(self, key: tuple[str, str], value: V) -> None:
        """Keep `value` as the owner's most recently used name (dropping its oldest past the
        limit)."""
        owner, name = key
        names = self._owners.setdefault(owner, OrderedDict())
        names[name] = value
        names.move_to_end(name)
        if len(names) > self.max_per_owner:
            names.popitem(last=False)

    def __len__(self) -> int:
        return sum(len(names) for names in self._owners.values())
