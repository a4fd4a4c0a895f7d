import time

import pytest

from predictor.features import (
    DENSE_NAMES,
    HASH_DIM,
    HEAD_CHARS,
    TAIL_CHARS,
    extract,
    requested_tokens,
    view,
    words_of,
)


def dense(text: str) -> dict[str, float]:
    return dict(zip(DENSE_NAMES, extract(text, 40).dense, strict=True))


def test_same_input_gives_the_same_features() -> None:
    a, b = extract("Write a poem about the sea.", 20), extract("Write a poem about the sea.", 20)
    assert a == b
    assert all(0 <= i < HASH_DIM for i in a.hashed)
    assert a.hashed_value == pytest.approx(len(a.hashed) ** -0.5)


@pytest.mark.parametrize(
    ("text", "cue"),
    [
        ("List ten ideas for a birthday party.", "cue_list"),
        ("Explain quantum tunnelling in depth.", "cue_detail"),
        ("Answer in one word: capital of Peru?", "cue_one_word"),
        ("Write an essay on the French revolution.", "cue_longform"),
        ("Write a Python function that reverses a list.", "cue_code"),
        ("Translate 'good morning' to German.", "cue_transform"),
        ("Summarize this paragraph briefly.", "cue_brief"),
        ("Act as a travel agent for me.", "cue_roleplay"),
    ],
)
def test_phrasing_cues_fire(text: str, cue: str) -> None:
    assert dense(text)[cue] == 1.0


def test_cues_stay_quiet_on_unrelated_text() -> None:
    values = dense("The weather was pleasant yesterday afternoon.")
    assert all(v == 0.0 for k, v in values.items() if k.startswith("cue_"))


def test_question_starts_are_recognised() -> None:
    assert dense("What is the boiling point of water?")["starts_factoid"] == 1.0
    assert dense("Is Pluto a planet?")["starts_yes_no"] == 1.0
    assert dense("Is Pluto a planet?")["question_mark"] == 1.0


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("Write a 500-word essay.", 500 * 1.4),
        ("Give me ten short ideas.", 10 * 25),
        ("Write a 10,000-word story.", 10_000 * 1.4),
        ("Write five thousand words.", 5000 * 1.4),
        ("Name 3 fruits.", 0.0),  # "fruits" is no unit
        ("In 2023 there were 3 people.", 0.0),
        ("debounce(fetchData, 300); usage example", 0.0),  # a word between that is no adjective
    ],
)
def test_requested_tokens(text: str, tokens: float) -> None:
    assert requested_tokens(words_of(text)) == pytest.approx(tokens)


def test_view_bounds_what_is_read() -> None:
    long_text = "alpha " * 10_000 + "omega"
    seen = view(long_text)
    assert len(seen) == HEAD_CHARS + TAIL_CHARS + 1
    assert seen.endswith("omega")


def test_cost_does_not_grow_with_prompt_length() -> None:
    at_bound = "Explain attention. " * ((HEAD_CHARS + TAIL_CHARS) // 19)
    long_ = "Explain attention. " * 5000

    def best_of(text: str) -> float:
        times = []
        for _ in range(20):
            start = time.perf_counter()
            extract(text, 10)
            times.append(time.perf_counter() - start)
        return min(times)

    assert best_of(long_) < 3 * best_of(at_bound)
