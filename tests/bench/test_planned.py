from bench.sim.planned import table_planner
from bench.sim.predictions import lying, oracle
from bench.sim.simulator import Simulation
from bench.workloads.format import Job, Node
from tenants.policies import make_policy
from tests.bench.test_sim import make_setup


def calls(tenant: str, kind: str, count: int, output: int, every_s: float) -> list[Job]:
    return [
        Job(f"{tenant}-{i}", tenant, 1.0, i * every_s, kind, (Node("n", (), 50, output, 400),))
        for i in range(count)
    ]


def test_a_liar_is_planned_conservatively_before_its_first_call_ends() -> None:
    honest = calls("honest", "chat", 20, 30, 0.05)
    liar = calls("liar", "attack", 8, 400, 0.5)  # claims 10 tokens, runs to its max_tokens
    jobs = sorted(honest + liar, key=lambda j: (j.arrival, j.job_id))
    table = lying(jobs, {(j.job_id, "n"): 10.0 for j in liar})
    predictor = table_planner(table, 1024)
    Simulation(jobs, make_policy("justitia"), make_setup(num_blocks=400), predictor).run()
    log = predictor.log
    assert set(log.conservative) == {"attack"}  # exact predictions are never distrusted
    assert log.finished_before["attack"] == 0  # three calls past their p90 sufficed
    assert 3 <= log.conservative["attack"] <= 8 - 3  # the first three had to run first


def test_truthful_predictions_through_the_planner_stay_as_told() -> None:
    jobs = calls("a", "chat", 5, 30, 0.1)
    predictor = table_planner(oracle(jobs), 1024)
    for job in jobs:
        estimate = predictor.plan(job, job.nodes[0], 0.0)
        assert estimate.policy_output == 30 and estimate.reserve_output == 30


def test_a_liars_backlog_ready_before_it_was_found_out_loses_its_head_start() -> None:
    """Calls planned before their kind turned conservative kept their short plans while they
    waited: a liar whose whole backlog was ready at once kept going first once found out (one
    of its 40 calls finished after the honest tenant's last job). Its calls still waiting at the
    switch are now widened, and go after the honest tenant's."""
    liar = calls("liar", "attack", 40, 400, 0.0)  # all ready at once, claiming 10 tokens each
    honest = calls("honest", "chat", 16, 60, 0.0)
    jobs = sorted(honest + liar, key=lambda j: (j.arrival, j.job_id))
    predictor = table_planner(lying(jobs, {(j.job_id, "n"): 10.0 for j in liar}), 1024)
    result = Simulation(jobs, make_policy("justitia"), make_setup(num_blocks=100), predictor).run()
    last_honest = max(result.finish[j.job_id] for j in honest)
    behind = sum(result.finish[j.job_id] > last_honest for j in liar)
    assert behind >= 20  # 1 while they kept their short plans
    assert set(predictor.log.conservative) == {"attack"}
    assert predictor.log.conservative["attack"] <= behind  # each planned before the switch
