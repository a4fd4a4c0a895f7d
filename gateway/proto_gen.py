"""Generate the Python code of the protos, or tell whether the checked-in code is stale.

Algorithm: grpcio-tools' bundled protoc compiles every `protos/**/*.proto` with `-Iprotos`
into a scratch folder — messages (`_pb2.py`), gRPC stubs (`_pb2_grpc.py`) and mypy-protobuf
type stubs (`_pb2.pyi`, `_pb2_grpc.pyi`) — so generated imports read `from fairgate.v1 import
...`. `generate` then mirrors the scratch folder into the project; `--check` only compares.
Invariant: after `generate`, the generated files under each proto package folder are exactly
what protoc emits now (files of removed protos are deleted); hand-written files in those folders
(`__init__.py`, `py.typed`) are never touched.

Usage: `python -m gateway.proto_gen` regenerates; `python -m gateway.proto_gen --check` exits 1
and names the stale files when the generated code does not match the protos.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = PROJECT_ROOT / "protos"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


class ProtocFailed(RuntimeError):
    """protoc rejected the protos or a plugin failed; its own message went to stderr."""


def _plugin(name: str) -> Path:
    # The plugins are console scripts installed next to the interpreter, which need not be on PATH.
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise ProtocFailed(f"{name} not found next to {sys.executable}; install mypy-protobuf")
    return path


def emit(proto_root: Path, out_root: Path) -> None:
    """Compile every proto under proto_root into out_root (package folders mirror proto paths)."""
    protos = sorted(str(p.relative_to(proto_root)) for p in proto_root.rglob("*.proto"))
    if not protos:
        raise ProtocFailed(f"no .proto files under {proto_root}")
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--mypy_out=quiet:{out_root}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        # grpc.aio only: the server and the SDK are asyncio, and the sync/async union stubs
        # do not pass mypy --strict while grpc ships no type hints.
        f"--mypy_grpc_out=only_async,quiet:{out_root}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise ProtocFailed(f"protoc failed on {proto_root}")


def _generated_files(proto_root: Path, root: Path) -> dict[str, bytes]:
    """Generated files (relative path -> bytes) in the package folders the protos map to."""
    folders = {p.parent.relative_to(proto_root) for p in proto_root.rglob("*.proto")}
    found: dict[str, bytes] = {}
    for folder in folders:
        for path in sorted((root / folder).glob("*")):
            if path.is_file() and path.name.endswith(GENERATED_SUFFIXES):
                found[str(path.relative_to(root))] = path.read_bytes()
    return found


def _fresh_files(proto_root: Path) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory(prefix="fairgate-proto-") as scratch:
        emit(proto_root, Path(scratch))
        return _generated_files(proto_root, Path(scratch))


def _differing(fresh: dict[str, bytes], current: dict[str, bytes]) -> list[str]:
    return sorted(p for p in fresh.keys() | current.keys() if fresh.get(p) != current.get(p))


def stale_files(proto_root: Path, out_root: Path) -> list[str]:
    """Generated paths under out_root that are missing, differ from protoc's output, or extra."""
    return _differing(_fresh_files(proto_root), _generated_files(proto_root, out_root))


def generate(proto_root: Path, out_root: Path) -> list[str]:
    """Bring the generated code under out_root up to date; return the paths it changed."""
    fresh = _fresh_files(proto_root)
    changed = _differing(fresh, _generated_files(proto_root, out_root))
    for relative in changed:
        target = out_root / relative
        if relative in fresh:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(fresh[relative])
        else:
            target.unlink()
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.proto_gen",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the generated code is stale"
    )
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = stale_files(PROTO_ROOT, PROJECT_ROOT)
            for path in stale:
                print(f"stale: {path}", file=sys.stderr)
            if stale:
                print("run: python -m gateway.proto_gen", file=sys.stderr)
            return 1 if stale else 0
        for path in generate(PROTO_ROOT, PROJECT_ROOT):
            print(f"wrote: {path}")
        return 0
    except ProtocFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
