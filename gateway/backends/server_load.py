"""A vLLM-compatible server's load, read from its Prometheus `/metrics` text.

Reads the gauges vLLM exports, and `fairgate engine serve` under the same names:
`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (0..1) and
`vllm:cache_config_info`, whose labels carry the pool's shape (`num_gpu_blocks`, `block_size`).
Only the lines of those families are parsed. A server with several engines (data parallel)
exports one series per engine (label `engine`): requests and blocks add up, and the KV use is
weighted by each engine's blocks. Series of another model (label `model_name`) are left out.
Pure: text in, a snapshot out.
Invariant: a text without the pool's shape or the request gauges, or with a value no server
has (a count that is NaN, negative or past `MAX_COUNT`, a KV use outside 0..1), is refused
(ValueError), never read as an idle server: so nothing computed from them can overflow. So is one
whose lines naming the four families are longer than any server's (`MAX_LINE`, `MAX_OURS`): the
parser runs on the event loop, in time that grows with their length and, on one line, with the
square of its labels (a 1 MiB line of labels took 12 s, during which the gateway did nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
CACHE_CONFIG = "vllm:cache_config_info"
NAMES = frozenset((RUNNING, WAITING, KV_USAGE, CACHE_CONFIG))
MAX_COUNT = 2**31  # bound on a count of requests or blocks, far past any server's
# bounds on the lines that name the four families, past any server's: vLLM's longest
# (cache_config_info, a label per setting) is under 1 KiB, and a server has a line per family
# and engine (over a hundred engines fit); the parse of lines at these bounds takes 0.1 s
MAX_LINE = 2048
MAX_OURS = 128 << 10


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """One scrape of a server."""

    running: int  # requests in its batches
    waiting: int  # requests queued for their first schedule (or preempted)
    num_blocks: int  # KV blocks in its pool
    used_blocks: int  # of those, in use
    block_size: int  # tokens per block
    taken_at: float  # clock time when the scrape was sent (the snapshot is at least this fresh)

    @property
    def free_blocks(self) -> int:
        return max(self.num_blocks - self.used_blocks, 0)


def parse_load(text: str, model: str, taken_at: float) -> ServerLoad:
    """The load of `model` in a Prometheus text exposition; ValueError when it is not there."""
    gauges: dict[str, dict[str, float]] = {RUNNING: {}, WAITING: {}, KV_USAGE: {}}  # by engine
    blocks: dict[str, int] = {}  # engine -> num_gpu_blocks
    block_sizes: set[int] = set()
    for family in text_string_to_metric_families(_only_ours(text)):
        for sample in family.samples:
            labels = sample.labels
            engine = labels.get("engine", "0")
            if sample.name == CACHE_CONFIG:
                blocks[engine] = _int_label(labels, "num_gpu_blocks")
                block_sizes.add(_int_label(labels, "block_size"))
            elif sample.name in gauges and labels.get("model_name", model) == model:
                bound = 1.0 if sample.name == KV_USAGE else MAX_COUNT
                if not 0 <= sample.value <= bound:  # NaN fails it too
                    raise ValueError(f"/metrics gives {sample.name} = {sample.value}")
                gauges[sample.name][engine] = sample.value
    missing = [name for name in (RUNNING, WAITING, KV_USAGE) if not gauges[name]]
    if not blocks or missing:
        raise ValueError(f"/metrics lacks {', '.join(missing or [CACHE_CONFIG])} for {model!r}")
    if len(block_sizes) != 1:
        raise ValueError(f"/metrics gives engines of different block sizes: {sorted(block_sizes)}")
    usage = gauges[KV_USAGE]
    used = sum(usage.get(engine, 0.0) * num for engine, num in blocks.items())
    return ServerLoad(
        running=round(sum(gauges[RUNNING].values())),
        waiting=round(sum(gauges[WAITING].values())),
        num_blocks=sum(blocks.values()),
        used_blocks=min(round(used), sum(blocks.values())),
        block_size=block_sizes.pop(),
        taken_at=taken_at,
    )


def _int_label(labels: dict[str, str], name: str) -> int:
    value = labels.get(name, "")
    if not value.isdigit() or not 1 <= int(value) <= MAX_COUNT:
        raise ValueError(f"{CACHE_CONFIG} has {name}={value!r}, not a count of a server's")
    return int(value)


def _only_ours(text: str) -> str:
    """The lines of the four families read here: vLLM's whole exposition (histograms of every
    latency, bucket by bucket) is many times larger, and it is read several times a second, so
    the lines are found by searching for each name (a scan in C) rather than by reading every
    line (about 9 x faster on vLLM's text). ValueError past `MAX_LINE` or `MAX_OURS`."""
    kept = []
    read = 0  # the length of the lines that name a family, kept or not
    for name in NAMES:
        at = text.find(name)
        while at != -1:
            # the format's only line end is LF (a label may hold U+2028)
            start, end = text.rfind("\n", 0, at) + 1, text.find("\n", at)
            end = len(text) if end == -1 else end
            read += end - start + 1
            if end - start > MAX_LINE or read > MAX_OURS:
                raise ValueError(f"/metrics has longer lines of {name} than a server's")
            line = text[start:end]
            if _family(line) == name:  # not a longer name, a label or another's help text
                kept.append(line)
            at = text.find(name, end)
    return "\n".join(kept) + "\n"


def _family(line: str) -> str:
    """The family a line of the exposition is about."""
    if line.startswith("#"):
        parts = line.split(maxsplit=3)
        return parts[2] if len(parts) > 2 else ""
    return line.split("{", 1)[0].split(" ", 1)[0]
