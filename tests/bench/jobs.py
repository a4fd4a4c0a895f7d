"""A small job DAG the simulator tests share."""

from bench.workloads.format import Job, Node


def diamond(arrival: float = 0.0, right_think: float = 0.0) -> Job:
    """plan -> left (30 tokens, after 2 s of think) and right (5 tokens) -> join (after 1 s)."""
    return Job(
        "j",
        "t",
        1.0,
        arrival,
        "dag",
        (
            Node("plan", (), 50, 10, 64),
            Node("left", ("plan",), 60, 30, 64, think_s=2.0),
            Node("right", ("plan",), 60, 5, 64, think_s=right_think),
            Node("join", ("left", "right"), 80, 8, 64, think_s=1.0),
        ),
    )
