"""The protos keep wire compatibility with the released shape (protos/wire.json)."""

from __future__ import annotations

import copy
import json

from gateway.wire import SNAPSHOT, incompatible, wire_shape

JOB = "fairgate.v1.JobSpec"


def released() -> dict[str, object]:
    return json.loads(SNAPSHOT.read_text())  # type: ignore[no-any-return]


def test_the_protos_keep_every_released_field_number_and_type() -> None:
    assert incompatible(released(), wire_shape()) == []


def test_a_changed_type_a_reused_number_and_an_unreserved_removal_are_caught() -> None:
    shape = wire_shape()
    changed = copy.deepcopy(shape)
    changed["messages"][JOB]["fields"]["5"][1] = 9  # priority: int32 -> string
    assert incompatible(shape, changed) == [f"{JOB} field 5 (priority) changed type or label"]
    reused = copy.deepcopy(shape)
    reused["messages"][JOB]["fields"]["5"] = ["urgency", 2, 1, "", False]  # now a float
    assert len(incompatible(shape, reused)) == 1
    removed = copy.deepcopy(shape)
    del removed["messages"][JOB]["fields"]["5"]
    assert incompatible(shape, removed) == [f"{JOB} field 5 (priority) removed without reserving"]
    removed["messages"][JOB]["reserved"].append([5, 6])
    assert incompatible(shape, removed) == []


def test_additions_are_compatible_and_removed_enum_values_are_not() -> None:
    shape = wire_shape()
    grown = copy.deepcopy(shape)
    grown["messages"][JOB]["fields"]["99"] = ["sessions", 9, 1, "", False]
    grown["messages"]["fairgate.v1.NewThing"] = {"fields": {}, "reserved": []}
    assert incompatible(shape, grown) == []
    enum = next(iter(shape["enums"]))
    shrunk = copy.deepcopy(shape)
    number = max(shrunk["enums"][enum]["values"], key=int)
    del shrunk["enums"][enum]["values"][number]
    assert len(incompatible(shape, shrunk)) == 1
