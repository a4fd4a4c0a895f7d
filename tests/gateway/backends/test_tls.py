"""An https backend: its certificate checked against a CA file, or not at all when told."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
import uvicorn

from engine import AsyncEngine
from engine.openai_api import build_app, listening_socket
from gateway.backends import BackendUnreachable
from tests.gateway.backends.conftest import MODEL, backend_on, make_call, sim_core

pytestmark = pytest.mark.anyio


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA, and its key."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the test runner's signals stay its own


@contextlib.asynccontextmanager
async def https_remote(cert: Path, key: Path) -> AsyncIterator[str]:
    async with AsyncEngine(sim_core()) as engine:
        with listening_socket("127.0.0.1", 0) as sock:
            config = uvicorn.Config(
                build_app(engine, MODEL),
                lifespan="off",
                log_config=None,
                access_log=False,
                ssl_certfile=str(cert),
                ssl_keyfile=str(key),
            )
            server = _Server(config)
            async with anyio.create_task_group() as tg:
                tg.start_soon(server.serve, [sock])
                try:
                    yield f"https://127.0.0.1:{sock.getsockname()[1]}"
                finally:
                    server.should_exit = True


async def test_https_with_the_servers_ca_and_without_it(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    cert, key = self_signed(tmp_path)
    async with https_remote(cert, key) as url:
        async with backend_on(url, tokenizer_dir, tls_ca_file=cert) as backend:
            assert backend.capacity().healthy
            assert [d async for d in backend.submit(make_call())][-1].finished
        with pytest.raises(BackendUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
            async with backend_on(url, tokenizer_dir):  # the system's CAs do not know it
                pass
        async with backend_on(url, tokenizer_dir, tls_verify=False) as backend:
            assert backend.capacity().healthy
