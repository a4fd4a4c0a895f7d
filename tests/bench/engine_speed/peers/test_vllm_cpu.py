from bench.engine_speed.peers.vllm_cpu import worker_env


def test_vllm_threads_are_bound_to_the_benchmark_cores() -> None:
    assert worker_env(2)["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert worker_env(1)["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert worker_env(2)["VLLM_CPU_KVCACHE_SPACE"] == "2"
