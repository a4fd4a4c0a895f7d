"""Job errors, named for the state they report; the gRPC edge maps them to status codes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One problem with a job: `field` is a path relative to JobSpec, e.g. `nodes[3].id`."""

    field: str
    description: str


class JobInvalid(ValueError):
    """A job spec breaks one or more rules; `violations` lists them.

    The message names the first only: it becomes a gRPC status message, which travels in a
    size-capped trailer beside the full list.
    """

    def __init__(self, violations: Sequence[FieldViolation]) -> None:
        self.violations = list(violations)
        first = self.violations[0]
        more = f" (and {len(self.violations) - 1} more)" if len(self.violations) > 1 else ""
        super().__init__(f"invalid job: {first.field}: {first.description}{more}")


class DagCyclic(ValueError):
    """The dependency graph has a cycle: `cycle[0]` depends on `cycle[1]`, ..., back to itself."""

    def __init__(self, cycle: Sequence[str]) -> None:
        self.cycle = list(cycle)
        super().__init__("dependency cycle: " + " -> ".join([*self.cycle, self.cycle[0]]))


class DagUnknownNode(ValueError):
    """An edge names a node the graph does not have."""

    def __init__(self, node_id: str, parent_id: str) -> None:
        self.node_id = node_id
        self.parent_id = parent_id
        super().__init__(f"node {node_id!r} depends on unknown node {parent_id!r}")


class TemplateUnresolved(KeyError):
    """A template placeholder has no value: an unknown input or output, or a malformed form."""

    def __init__(self, placeholder: str) -> None:
        self.placeholder = placeholder
        super().__init__(placeholder)
