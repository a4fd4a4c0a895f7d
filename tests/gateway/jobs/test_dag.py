from __future__ import annotations

import random

import pytest

from gateway.jobs.dag import Dag, find_cycles
from gateway.jobs.errors import DagCyclic, DagUnknownNode
from tests.gateway.jobs.factories import make_job, make_map_reduce, make_node

DIAMOND = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}


def assert_topological(dag: Dag) -> None:
    position = {node: i for i, node in enumerate(dag.order)}
    assert len(position) == len(dag.order) == len(dag.parents)
    for node, parents in dag.parents.items():
        assert all(position[p] < position[node] for p in parents)


def test_diamond_maps_and_measures() -> None:
    dag = Dag.build(DIAMOND)
    assert dag.order == ("a", "b", "c", "d")
    assert dag.parents == {"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c")}
    assert dag.children == {"a": ("b", "c"), "b": ("d",), "c": ("d",), "d": ()}
    assert dag.roots() == ("a",)
    assert dag.leaves() == ("d",)
    assert dag.depths() == {"a": 1, "b": 2, "c": 2, "d": 3}
    assert dag.depth() == 3
    assert dag.max_fan_out() == 2
    assert dag.ancestors("d") == {"a", "b", "c"}
    assert dag.ancestors("a") == frozenset()


def test_order_keeps_declaration_order_among_ready_nodes() -> None:
    dag = Dag.build({"z": [], "m": ["z"], "a": [], "k": ["a", "z"]})
    assert dag.order == ("z", "a", "m", "k")


def test_repeated_dependency_counts_once() -> None:
    dag = Dag.build({"a": [], "b": ["a", "a"]})
    assert dag.parents["b"] == ("a",)
    assert dag.children["a"] == ("b",)
    assert dag.order == ("a", "b")


def test_unknown_dependency_is_refused() -> None:
    with pytest.raises(DagUnknownNode) as caught:
        Dag.build({"a": ["ghost"]})
    assert (caught.value.node_id, caught.value.parent_id) == ("a", "ghost")


def test_cycle_is_refused_and_named() -> None:
    with pytest.raises(DagCyclic) as caught:
        Dag.build({"root": [], "a": ["root", "c"], "b": ["a"], "c": ["b"]})
    assert caught.value.cycle == ["a", "c", "b"]
    assert str(caught.value) == "dependency cycle: a -> c -> b -> a"


def test_find_cycles_reports_each_back_edge() -> None:
    edges = {"a": ["b"], "b": ["a"], "s": ["s"], "x": ["y", "ghost"], "y": []}
    assert find_cycles(edges, 10) == [["a", "b"], ["s"]]
    assert find_cycles(edges, 1) == [["a", "b"]]  # the first `limit` only
    assert find_cycles(DIAMOND, 10) == []


def test_a_dense_graph_s_cycles_stop_at_the_limit() -> None:
    nodes = [f"n{i}" for i in range(256)]
    edges = {node: [other for other in nodes if other != node] for node in nodes}
    assert len(find_cycles(edges, 32)) == 32  # of the 32,640 its back edges close


def test_long_chain_needs_no_recursion() -> None:
    n = 5000
    edges = {f"n{i}": [f"n{i - 1}"] if i else [] for i in range(n)}
    dag = Dag.build(edges)
    assert dag.depth() == n
    edges["n0"] = [f"n{n - 1}"]
    (cycle,) = find_cycles(edges, 10)
    assert len(cycle) == n


def test_of_job_uses_depends_on() -> None:
    dag = Dag.of_job(make_map_reduce(3))
    assert dag.parents["reduce"] == ("map_0", "map_1", "map_2")
    assert dag.roots() == ("map_0", "map_1", "map_2")
    assert dag.max_fan_out() == 1
    chain = make_job(make_node("a"), make_node("b", depends_on=("a",)))
    assert Dag.of_job(chain).order == ("a", "b")


def _random_dag(rng: random.Random, size: int) -> dict[str, list[str]]:
    """Edges only to earlier nodes (acyclic), declared in a shuffled order."""
    names = [f"n{i}" for i in range(size)]
    edges = {name: rng.sample(names[:i], rng.randint(0, min(i, 3))) for i, name in enumerate(names)}
    shuffled = list(edges.items())
    rng.shuffle(shuffled)
    return dict(shuffled)


def _reachable(edges: dict[str, list[str]], node: str) -> set[str]:
    """The reference: a search along depends_on from `node`."""
    seen: set[str] = set()
    stack = list(edges[node])
    while stack:
        parent = stack.pop()
        if parent not in seen:
            seen.add(parent)
            stack.extend(edges[parent])
    return seen


def test_seeded_random_graphs() -> None:
    rng = random.Random(20240531)
    for _ in range(300):
        edges = _random_dag(rng, rng.randint(1, 25))
        dag = Dag.build(edges)
        assert_topological(dag)
        assert find_cycles(edges, 10) == []
        for node in edges:
            assert dag.depths()[node] == 1 + max((dag.depths()[p] for p in edges[node]), default=0)
            assert dag.ancestors(node) == _reachable(edges, node)
        # Any edge from a node to one of its descendants closes a cycle through it.
        source = rng.choice(list(edges))
        descendants = [n for n in edges if source in dag.ancestors(n)]
        if descendants:
            edges[source] = [*edges[source], rng.choice(descendants)]
            cycles = find_cycles(edges, len(edges) ** 2)
            assert cycles
            for cycle in cycles:
                for node, parent in zip(cycle, [*cycle[1:], cycle[0]], strict=True):
                    assert parent in edges[node]
            with pytest.raises(DagCyclic):
                Dag.build(edges)
