"""The protos' wire shape, and whether a change keeps released clients working.

A message's wire shape is its field numbers with each field's type (and, for message and enum
fields, the type's full name) and label; an enum's, its value numbers; a service's, its methods
with their request and response types. `protos/wire.json` keeps the released shape. A change is
compatible when every released message, enum and method still exists, every released field
number keeps its type and label or is reserved, and every released enum value keeps its number
or is reserved: new fields, values, messages and methods are always fine.

Usage: `python -m gateway.wire --write` records the current shape (do it when a release ships);
`tests/gateway/test_wire.py` fails on any change `incompatible` reports.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FileDescriptor

from fairgate.v1 import admin_pb2, gateway_pb2

SNAPSHOT = Path(__file__).resolve().parent.parent / "protos" / "wire.json"
FILES = (gateway_pb2.DESCRIPTOR, admin_pb2.DESCRIPTOR)
Shape = dict[str, Any]


def wire_shape(files: tuple[FileDescriptor, ...] = FILES) -> Shape:
    shape: Shape = {"messages": {}, "enums": {}, "methods": {}}
    for file in files:
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        prefix = proto.package
        for message in proto.message_type:
            _message(shape, f"{prefix}.{message.name}", message)
        for enum in proto.enum_type:
            _enum(shape, f"{prefix}.{enum.name}", enum)
        for service in proto.service:
            for method in service.method:
                name = f"{prefix}.{service.name}/{method.name}"
                shape["methods"][name] = [method.input_type, method.output_type]
    return shape


def _message(shape: Shape, name: str, message: descriptor_pb2.DescriptorProto) -> None:
    fields = {
        str(f.number): [f.name, f.type, f.label, f.type_name, f.proto3_optional]
        for f in message.field
    }
    reserved = [[r.start, r.end] for r in message.reserved_range]
    shape["messages"][name] = {"fields": fields, "reserved": reserved}
    for nested in message.nested_type:
        if not nested.options.map_entry:
            _message(shape, f"{name}.{nested.name}", nested)
    for enum in message.enum_type:
        _enum(shape, f"{name}.{enum.name}", enum)


def _enum(shape: Shape, name: str, enum: descriptor_pb2.EnumDescriptorProto) -> None:
    values = {str(v.number): v.name for v in enum.value}
    reserved = [[r.start, r.end + 1] for r in enum.reserved_range]  # inclusive end in protos
    shape["enums"][name] = {"values": values, "reserved": reserved}


def incompatible(released: Shape, current: Shape) -> list[str]:
    """Every way `current` breaks clients of `released`; empty when it is compatible."""
    problems = []
    for name, old in released["messages"].items():
        new = current["messages"].get(name)
        if new is None:
            problems.append(f"message {name} was removed")
            continue
        for number, field in old["fields"].items():
            now = new["fields"].get(number)
            if now is None and not _reserved(int(number), new["reserved"]):
                problems.append(f"{name} field {number} ({field[0]}) removed without reserving")
            elif now is not None and now[1:4] != field[1:4]:
                problems.append(f"{name} field {number} ({field[0]}) changed type or label")
    for name, old in released["enums"].items():
        new = current["enums"].get(name)
        if new is None:
            problems.append(f"enum {name} was removed")
            continue
        for number, value in old["values"].items():
            if number not in new["values"] and not _reserved(int(number), new["reserved"]):
                problems.append(f"{name} value {number} ({value}) removed without reserving")
    for name, types in released["methods"].items():
        if current["methods"].get(name) != types:
            problems.append(f"method {name} was removed or changed its types")
    return problems


def _reserved(number: int, ranges: list[list[int]]) -> bool:
    return any(start <= number < end for start, end in ranges)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="record the current shape")
    args = parser.parse_args(argv)
    shape = wire_shape()
    if args.write:
        SNAPSHOT.write_text(json.dumps(shape, indent=1, sort_keys=True) + "\n")
        return 0
    problems = incompatible(json.loads(SNAPSHOT.read_text()), shape)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
