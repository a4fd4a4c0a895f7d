"""The checked-in generated code matches the protos, and the staleness check can tell."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from google.protobuf.descriptor import ServiceDescriptor

from fairgate.v1 import admin_pb2, gateway_pb2
from gateway import proto_gen

GENERATED = [
    f"fairgate/v1/{proto}{suffix}"
    for proto in ("admin", "gateway")
    for suffix in proto_gen.GENERATED_SUFFIXES
]


def test_generated_code_is_current() -> None:
    stale = proto_gen.stale_files(proto_gen.PROTO_ROOT, proto_gen.PROJECT_ROOT)
    assert stale == [], "generated code is stale: run `python -m gateway.proto_gen`"


@pytest.fixture
def scratch(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the protos and an output folder generated from them."""
    protos = tmp_path / "protos"
    shutil.copytree(proto_gen.PROTO_ROOT, protos)
    out = tmp_path / "out"
    out.mkdir()
    assert sorted(proto_gen.generate(protos, out)) == sorted(GENERATED)
    return protos, out


def test_generate_writes_what_check_then_accepts(scratch: tuple[Path, Path]) -> None:
    protos, out = scratch
    assert proto_gen.stale_files(protos, out) == []
    for relative in GENERATED:
        assert (out / relative).read_bytes() == (proto_gen.PROJECT_ROOT / relative).read_bytes()


def test_check_names_edited_missing_and_extra_files(scratch: tuple[Path, Path]) -> None:
    protos, out = scratch
    v1 = out / "fairgate/v1"
    with (v1 / "gateway_pb2.py").open("a") as generated:
        generated.write("# edited by hand\n")
    (v1 / "admin_pb2_grpc.pyi").unlink()
    (v1 / "removed_pb2.py").write_text("# from a proto that no longer exists\n")
    (v1 / "__init__.py").write_text("# hand-written, not generated\n")

    assert proto_gen.stale_files(protos, out) == [
        "fairgate/v1/admin_pb2_grpc.pyi",
        "fairgate/v1/gateway_pb2.py",
        "fairgate/v1/removed_pb2.py",
    ]
    proto_gen.generate(protos, out)
    assert proto_gen.stale_files(protos, out) == []
    assert not (v1 / "removed_pb2.py").exists()
    assert (v1 / "__init__.py").read_text() == "# hand-written, not generated\n"


def test_check_sees_a_changed_proto(scratch: tuple[Path, Path]) -> None:
    protos, out = scratch
    admin = protos / "fairgate/v1/admin.proto"
    admin.write_text(admin.read_text() + "\nmessage Extra {\n  string note = 1;\n}\n")
    assert proto_gen.stale_files(protos, out) == [
        "fairgate/v1/admin_pb2.py",
        "fairgate/v1/admin_pb2.pyi",
    ]


def test_main_check_exit_codes(scratch: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    protos, out = scratch
    monkeypatch.setattr(proto_gen, "PROTO_ROOT", protos)
    monkeypatch.setattr(proto_gen, "PROJECT_ROOT", out)
    assert proto_gen.main(["--check"]) == 0
    (out / "fairgate/v1/gateway_pb2.pyi").unlink()
    assert proto_gen.main(["--check"]) == 1
    assert proto_gen.main([]) == 0
    assert proto_gen.main(["--check"]) == 0


def test_main_reports_a_broken_proto(
    scratch: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    protos, out = scratch
    (protos / "fairgate/v1/admin.proto").write_text("syntax = 'proto3'; message {")
    monkeypatch.setattr(proto_gen, "PROTO_ROOT", protos)
    monkeypatch.setattr(proto_gen, "PROJECT_ROOT", out)
    assert proto_gen.main(["--check"]) == 2


def _methods(service: ServiceDescriptor) -> dict[str, tuple[str, str, bool]]:
    return {
        m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in service.methods
    }


def test_generated_services_carry_the_contract() -> None:
    assert _methods(gateway_pb2.DESCRIPTOR.services_by_name["Gateway"]) == {
        "SubmitJob": ("SubmitJobRequest", "Job", False),
        "WatchJob": ("WatchJobRequest", "JobEvent", True),
        "RunJob": ("SubmitJobRequest", "JobEvent", True),
        "GetJob": ("GetJobRequest", "Job", False),
        "CancelJob": ("CancelJobRequest", "Job", False),
        "Generate": ("GenerateRequest", "GenerateResponse", True),
    }
    assert set(_methods(admin_pb2.DESCRIPTOR.services_by_name["Admin"])) == {
        "CreateTenant",
        "GetTenant",
        "ListTenants",
        "UpdateTenant",
        "DeleteTenant",
        "IssueKey",
        "RevokeKey",
        "SetWeight",
        "SetQuota",
        "GetUsage",
        "GetStatus",
    }
