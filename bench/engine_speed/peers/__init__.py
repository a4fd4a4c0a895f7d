"""One benchmark worker per engine, each run in its own subprocess by
`bench.engine_speed.throughput`.

Every worker takes the same arguments (`protocol`) and writes the same result file. This package
imports only the standard library at import time, so the vLLM worker can run from its own
virtualenv.
"""

from bench.engine_speed.peers.protocol import WorkerArgs, WorkerResult

__all__ = ["WorkerArgs", "WorkerResult"]
