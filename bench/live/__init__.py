"""The scheduling study's live check: a scaled-down workload through the real gateway and
engine under every policy, then through the simulator, and the two rankings compared
(`python -m bench.live`; docs/BENCHMARKS.md, "Live check")."""

__all__: list[str] = []
