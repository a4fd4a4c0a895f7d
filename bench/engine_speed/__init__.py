"""How fast the engine runs: against its peers (`throughput`, with the GEMM `ceiling` and one
worker per engine in `peers/`), under Poisson arrivals (`online`), with prediction-aware KV
admission (`admission`), and on a lent GPU (`gpu`). Each module is a command
(`python -m bench.engine_speed.<name>`); `fairgate bench engine` runs `throughput`.

Imports only the standard library, like `bench`, for the vLLM worker's sake.
"""

__all__: list[str] = []
