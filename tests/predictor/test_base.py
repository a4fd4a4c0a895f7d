import pytest

from predictor.base import CallFeatures, LengthPredictor
from predictor.distribution import LengthDistribution
from predictor.errors import InvalidCall
from predictor.history import HistoryPredictor


def test_call_features_refuse_impossible_counts() -> None:
    with pytest.raises(InvalidCall):
        CallFeatures("t", "n", prompt_tokens=-1, max_tokens=10)
    with pytest.raises(InvalidCall):
        CallFeatures("t", "n", prompt_tokens=1, max_tokens=0)


def test_history_predictor_satisfies_the_protocol() -> None:
    predictor: LengthPredictor = HistoryPredictor(LengthDistribution.point(5))
    assert predictor.predict(CallFeatures("t", "n", 3, 4)).p50 == 4
