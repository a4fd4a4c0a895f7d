"""The length predictor's offline side and the prediction benchmarks.

Offline: the prompt sets with stable ids (`sources`), the labels of the serving model's own
output lengths (`label_lengths` writes them, `labels` reads them), the ranking and coverage
metrics (`metrics`) and the training of the shipped `prompt` artifacts (`training`). Benchmarks
(`fairgate bench predictor` runs `evaluate`): accuracy and overhead of every predictor, the
latency model on a replayed trace (`latency`), the anomaly guard on a hostile suite (`guard`),
and the hidden-layer sweep (`hidden_layers`). The server loads only the artifacts these write
(`predictor/artifacts/`).
"""

from bench.prediction.errors import LabelsInvalid, NotEnoughData
from bench.prediction.labels import LabelRow, is_held_out, read_labels, write_labels
from bench.prediction.metrics import censored_coverage_floor, coverage, kendall_tau, mae
from bench.prediction.sources import Prompt, load_source, resolve
from bench.prediction.training import train

__all__ = [
    "LabelRow",
    "LabelsInvalid",
    "NotEnoughData",
    "Prompt",
    "censored_coverage_floor",
    "coverage",
    "is_held_out",
    "kendall_tau",
    "load_source",
    "mae",
    "read_labels",
    "resolve",
    "train",
    "write_labels",
]
