"""Reading a server's load from its Prometheus text, as vLLM and fairgate's engine write it."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.backends.server_load import parse_load

MODEL = "m"


def exposition(
    running: float = 3,
    waiting: float = 1,
    usage: float = 0.25,
    engine: str = "0",
    blocks: int = 400,
    block_size: int = 16,
    model: str = MODEL,
) -> str:
    labels = f'engine="{engine}",model_name="{model}"'
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{{{labels}}} {running}\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{{{labels}}} {waiting}\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f"vllm:kv_cache_usage_perc{{{labels}}} {usage}\n"
        "# TYPE vllm:cache_config_info gauge\n"
        f'vllm:cache_config_info{{block_size="{block_size}",engine="{engine}",'
        f'num_gpu_blocks="{blocks}",enable_prefix_caching="False"}} 1.0\n'
    )


def test_one_engine() -> None:
    load = parse_load(exposition(), MODEL, taken_at=5.0)
    assert (load.running, load.waiting, load.num_blocks, load.block_size) == (3, 1, 400, 16)
    assert (load.used_blocks, load.free_blocks, load.taken_at) == (100, 300, 5.0)


def test_engines_of_one_server_add_up_and_their_kv_use_is_weighted() -> None:
    text = exposition(running=2, usage=0.5, engine="0") + exposition(
        running=1, usage=0.0, engine="1"
    ).replace("# TYPE", "# IGNORED")  # one TYPE line per family, as Prometheus writes it
    load = parse_load(text, MODEL, 0.0)
    assert (load.running, load.waiting, load.num_blocks, load.used_blocks) == (3, 2, 800, 200)


def test_another_models_series_are_left_out() -> None:
    text = exposition(running=7, model="other").replace(
        "vllm:cache_config_info", "vllm:unused_info"
    ) + exposition(running=2).replace("# TYPE", "# IGNORED")
    assert parse_load(text, MODEL, 0.0).running == 2


@pytest.mark.parametrize(
    ("text", "missing"),
    [
        ("", "vllm:num_requests_running"),
        (exposition().replace("vllm:cache_config_info", "vllm:other_info"), "cache_config_info"),
        (exposition().replace("vllm:kv_cache_usage_perc", "vllm:other"), "kv_cache_usage_perc"),
        (exposition(model="other"), "vllm:num_requests_running"),
        (exposition(blocks=0), "num_gpu_blocks"),
    ],
)
def test_a_text_without_the_load_is_refused_not_read_as_idle(text: str, missing: str) -> None:
    with pytest.raises(ValueError, match=missing):
        parse_load(text, MODEL, 0.0)


@pytest.mark.parametrize(
    ("gauges", "shown"),
    [
        ({"running": float("inf")}, "inf"),
        ({"waiting": float("nan")}, "nan"),
        ({"usage": -1}, "-1"),
        ({"running": 1e308}, "1e"),
        ({"usage": 1.5}, "1.5"),
        ({"usage": 1e308}, "1e"),
        ({"blocks": 2**40}, str(2**40)),
    ],
)
def test_a_gauge_that_is_no_count_is_refused_not_read(gauges: dict[str, Any], shown: str) -> None:
    # a misbehaving server's +Inf once overflowed round() and ended the backend's scrapes; so
    # did finite values whose sum or product is not (two engines' 1e308 requests, a KV use of
    # 1e308 times the blocks), and a block count past what a float holds
    with pytest.raises(ValueError, match=shown):
        parse_load(exposition(**gauges), MODEL, 0.0)


def test_engines_whose_counts_add_past_a_float_are_refused() -> None:
    one = exposition(running=2**31)
    other = exposition(running=2**31, engine="1").replace("# TYPE", "# IGNORED")
    load = parse_load(one + other, MODEL, 0.0)  # at the bound: read, and nothing overflows
    assert load.running == 2**32
    with pytest.raises(ValueError, match="num_requests_running"):
        parse_load(exposition(running=2**31 + 1), MODEL, 0.0)


def test_other_families_are_skipped_before_parsing() -> None:
    histogram = (
        "# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency.\n"
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="m"} 4.0\n'
        "vllm:num_requests_running_fake 99\n"
        "# HELP vllm:other Unlike vllm:num_requests_running, a counter.\n"
        'vllm:other{like="vllm:num_requests_waiting"} 7\n'
        "this line would not parse, nor would one that names vllm:kv_cache_usage_perc\n"
    )
    load = parse_load(histogram + exposition(running=2), MODEL, 0.0)
    assert (load.running, load.waiting) == (2, 1)
    # the families' lines first and last, the last with no line end
    load = parse_load(exposition(running=5).rstrip("\n") + "\n" + histogram, MODEL, 0.0)
    assert (load.running, load.num_blocks) == (5, 400)
    load = parse_load(histogram + exposition(running=6).rstrip("\n"), MODEL, 0.0)
    assert (load.running, load.num_blocks) == (6, 400)


def test_a_model_name_with_a_unicode_line_separator_is_one_line() -> None:
    # the exposition format ends lines at LF only; `str.splitlines` also at U+2028 and U+0085
    model = "served\u2028name\x85"
    load = parse_load(exposition(running=4, model=model), model, taken_at=0.0)
    assert (load.running, load.waiting) == (4, 1)


@pytest.mark.parametrize(
    "hostile",
    [
        # one line of many labels: the parser's time grows with their square (12 s a MiB)
        exposition().replace('engine="0"', ",".join(f'x{i}="a"' for i in range(300))),
        # a series per engine past any server's: read line by line, 5 s for 16 MiB
        exposition()
        + "".join(f'vllm:num_requests_running{{engine="{i}"}} 0\n' for i in range(1, 5000)),
    ],
)
def test_lines_of_the_families_longer_than_a_servers_are_refused_before_parsing(
    hostile: str,
) -> None:
    """The parser runs on the gateway's event loop: a `/metrics` text of 16 MiB (what a scrape
    reads) of such lines held the loop, and every call of the gateway, for minutes a scrape."""
    with pytest.raises(ValueError, match="longer lines"):
        parse_load(hostile, MODEL, 0.0)
