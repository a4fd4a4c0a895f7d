"""OpenTelemetry metrics of the GenAI semantic conventions (development, as released in
semantic-conventions v1.41.0, like the spans): what each call used and how long it took, for
OTLP backends.

Recorded once per call that ran in the engine, when it ends: `gen_ai.client.token.usage`
(input and output tokens, `gen_ai.token.type`), `gen_ai.client.operation.duration` (from the
call's start in the engine to its end, as the gateway, the engine's client, sees it),
`gen_ai.server.request.duration` (the same span, the engine being in process),
`gen_ai.server.time_to_first_token` and `gen_ai.server.time_per_output_token`. Each carries
`gen_ai.operation.name` (chat), `gen_ai.provider.name` and `gen_ai.request.model`, and
`error.type` when the call failed or was cancelled (the same code as its span's:
`gateway.spans.error_type`).
"""

from __future__ import annotations

from opentelemetry.metrics import Histogram, Meter

from gateway.job_run import CallTimes, NodeRun, NodeState
from gateway.spans import error_type
from gateway.telemetry import PROVIDER_NAME

DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)


class GenAiMetrics:
    def __init__(self, meter: Meter) -> None:
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Input and output tokens of a call",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self.operation = self._seconds(meter, "gen_ai.client.operation.duration", "A call")
        self.request = self._seconds(meter, "gen_ai.server.request.duration", "A call")
        self.ttft = self._seconds(meter, "gen_ai.server.time_to_first_token", "To the first token")
        self.tpot = self._seconds(
            meter, "gen_ai.server.time_per_output_token", "Per output token after the first"
        )

    @staticmethod
    def _seconds(meter: Meter, name: str, description: str) -> Histogram:
        return meter.create_histogram(
            name, unit="s", description=description,
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )  # fmt: skip

    def call_ended(self, node: NodeRun, produced: int, model: str, times: CallTimes) -> None:
        duration = times.run_time
        if duration is None:
            return  # it never ran on a backend
        base: dict[str, str] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDER_NAME,
            "gen_ai.request.model": model,
        }
        attributes: dict[str, str] = dict(base)
        if node.state in (NodeState.FAILED, NodeState.CANCELLED):
            attributes["error.type"] = error_type(node)
        self.operation.record(duration, attributes)
        self.request.record(duration, attributes)
        self.tokens.record(node.prompt_tokens, {**base, "gen_ai.token.type": "input"})
        self.tokens.record(produced, {**base, "gen_ai.token.type": "output"})
        for histogram, seconds in (
            (self.ttft, times.ttft),
            (self.tpot, times.tpot),
        ):
            if seconds is not None:
                histogram.record(seconds, attributes)
