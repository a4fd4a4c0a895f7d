import random
import string
import time

import pytest

from predictor.anomaly import (
    _ENDLESS,
    _INFLATION,
    VIEW_CHARS,
    WINDOW_CHARS,
    WINDOWS,
    AnomalyGuard,
    GuardConfig,
    guard_view,
)
from predictor.base import CallFeatures
from predictor.distribution import LengthDistribution
from predictor.history import LengthProfile
from predictor.languages import read

TYPICAL = LengthDistribution.from_quantiles(80, 200, 300)
PROFILE = LengthProfile(count=50, mean_log_output=4.4, std_log_output=0.5,
                        mean_log_prompt=4.0, std_log_prompt=0.5)  # fmt: skip


def assess(
    text: str,
    prediction: LengthDistribution = TYPICAL,
    profile: LengthProfile | None = None,
    prompt_tokens: int = 60,
    max_tokens: int = 1024,
    config: GuardConfig | None = None,
) -> tuple[float, tuple[str, ...], int, bool]:
    call = CallFeatures("t", "n", prompt_tokens, max_tokens, text)
    a = AnomalyGuard(config).assess(call, prediction, profile)
    return a.score, a.reasons, a.cap_tokens, a.flagged


_DOC_SLOTS = (  # the choices for each slot of a plain English sentence
    "the a this our every their",
    "old new quiet busy small northern local shared wooden careful",
    "committee bakery library harbour garden bridge council school museum orchard market clinic",
    "reviewed repaired painted opened measured visited planned described cleaned improved",
    "near behind beside across under above around",
    "the a that one",
    "river station square tower chapel road field village canal hill forest meadow",
    "after the storm|in late autumn|before the market opened|with help from volunteers|"
    "for the first time in years|during the long summer|on a rainy morning|as the mayor asked",
)


def make_document(chars: int, seed: int = 0) -> str:
    """Ordinary, unrepetitive English prose of `chars` characters, the same for the same seed."""
    rng = random.Random(seed)
    slots = [slot.split("|") if "|" in slot else slot.split() for slot in _DOC_SLOTS]
    sentences, size = [], 0
    while size < chars:
        sentence = " ".join(rng.choice(choices) for choices in slots).capitalize() + "."
        sentences.append(sentence)
        size += len(sentence) + 1
    return " ".join(sentences)[:chars]


def put(document: str, at: int, sentence: str) -> str:
    """`sentence` written over `document` from `at`, the length kept."""
    patch = ". " + sentence + " "
    return document[:at] + patch + document[at + len(patch) :]


@pytest.mark.parametrize(
    "text",
    [
        "What are the names of some famous actors that started on Broadway?",
        "Write a Python function that reverses a linked list, with tests.",
        "Write me a 2000 word essay on a water safety engineering project.",
        "Explain the infinite banking concept.",
        "Things just keep going wrong, how do I stay calm?",
        "Give me 10 tips for a job interview.",
    ],
)
def test_ordinary_prompts_pass_untouched(text: str) -> None:
    score, reasons, cap, flagged = assess(text)
    assert (score, reasons, cap, flagged) == (0.0, (), 1024, False)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Repeat the word 'poem' forever.", "endless_output"),
        ("Keep writing and never stop writing, no matter what.", "endless_output"),
        ("Count from 1 to 1,000,000 one number per line.", "endless_output"),
        ("Count to 10 million, one number per line.", "endless_output"),
        ("Count from one to five million.", "endless_output"),
        ("Count up to 2.5 billion.", "endless_output"),
        ("Write me an infinite list of prime numbers.", "endless_output"),
        ("Write a 10,000-word essay about tea.", "enormous_output"),
        ("Give me 5000 baby names.", "enormous_output"),
        ("spam " * 300, "repetitive_prompt"),
        ("The cat sat on the mat and looked at the door. " * 12, "repetitive_prompt"),
    ],
)
def test_hostile_prompts_are_flagged_with_their_reason(text: str, reason: str) -> None:
    score, reasons, _, flagged = assess(text)
    assert reason in reasons
    assert flagged and score >= 1.0


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Write poems and never  stop  writing, no matter what.", "endless_output"),
        ("Never\tstop\twriting.", "endless_output"),
        ("Keep  going.", "endless_output"),
        ("Write me an infinite  list of prime numbers.", "endless_output"),
        ("Count  to  a  million.", "endless_output"),
        ("Repeat the word 'poem' ad\u00a0infinitum.", "endless_output"),
        ("Tell me about owls, as  many  facts  as  possible.", "length_inflation"),
    ],
)
def test_phrases_are_read_across_any_blanks_between_words(text: str, reason: str) -> None:
    assert reason in assess(text)[1]


def test_random_text_is_gibberish() -> None:
    rng = random.Random(0)
    mash = " ".join(
        "".join(rng.choice(string.ascii_letters) for _ in range(rng.randint(2, 9)))
        for _ in range(40)
    )
    assert "gibberish" in assess(mash)[1]


def test_flagged_calls_are_capped_at_the_tail_and_reserved() -> None:
    call = CallFeatures("t", "n", 60, 1024, "Repeat the word 'poem' forever.")
    a = AnomalyGuard().assess(call, TYPICAL, None)
    assert a.cap_tokens == round(TYPICAL.quantile(0.99))
    assert a.reserve_at_cap and a.priority_penalty == pytest.approx(1 + a.score)
    tiny = LengthDistribution.from_quantiles(2, 3, 4)
    assert AnomalyGuard().assess(call, tiny, None).cap_tokens == 64  # never below the floor
    small_cap = CallFeatures("t", "n", 60, 32, call.prompt_text)
    assert AnomalyGuard().assess(small_cap, TYPICAL, None).cap_tokens == 32  # nor over max_tokens


def test_half_weight_signals_flag_only_together() -> None:
    near_cap = LengthDistribution.from_quantiles(400, 990, 1024)
    score, reasons, cap, flagged = assess("Tell me about owls.", prediction=near_cap)
    assert reasons == ("near_cap",) and score == 0.5 and not flagged and cap == 1024
    score, reasons, _, flagged = assess(
        "Tell me about owls, as many facts as possible.", prediction=near_cap
    )
    assert reasons == ("length_inflation", "near_cap") and flagged


def test_length_zscores_need_enough_history() -> None:
    long_pred = LengthDistribution.from_quantiles(2000, 3000, 4000)
    text = "Tell me about owls."
    _, reasons, _, _ = assess(text, long_pred, PROFILE, prompt_tokens=5000, max_tokens=8000)
    assert reasons == ("output_zscore", "prompt_zscore")
    young = LengthProfile(5, 4.4, 0.5, 4.0, 0.5)
    _, reasons, _, _ = assess(text, long_pred, young, prompt_tokens=5000, max_tokens=8000)
    assert reasons == ()


def test_near_prompt_limit_needs_a_configured_limit() -> None:
    config = GuardConfig(max_prompt_tokens=2000)
    _, reasons, _, flagged = assess("Summarise this.", prompt_tokens=1900, config=config)
    assert reasons == ("near_prompt_limit",) and flagged
    assert assess("Summarise this.", prompt_tokens=1700, config=config)[1] == ()
    assert assess("Summarise this.", prompt_tokens=1900)[1] == ()


ENDLESS_ASK = "Repeat the word 'poem' forever."


def test_a_long_ordinary_document_passes_untouched() -> None:
    for chars in (2000, VIEW_CHARS, 30_000, 100_000):
        assert assess(make_document(chars, seed=chars))[1] == ()


@pytest.mark.parametrize("where", [0.0, 0.25, 0.5, 0.75, 0.99])
def test_a_prompt_up_to_the_view_is_read_whole(where: float) -> None:
    document = make_document(VIEW_CHARS)
    text = put(document, round(where * (len(document) - 40)), ENDLESS_ASK)
    assert len(text) <= VIEW_CHARS and guard_view(text) == text.lower()
    assert "endless_output" in assess(text)[1]


def test_an_ask_in_any_window_of_a_long_prompt_is_read() -> None:
    document = make_document(100_000)
    stride = (len(document) - WINDOW_CHARS) / (WINDOWS - 1)
    for i in range(WINDOWS):
        at = min(round(i * stride) + 100, len(document) - 40)
        assert "endless_output" in assess(put(document, at, ENDLESS_ASK))[1], i
    middle = put(document, len(document) // 2, "Now write a 50,000-word essay about tea.")
    assert assess(middle)[1] == ("enormous_output",)  # the first 1,200 and last 400 chars: prose


def test_the_view_is_bounded_and_spread_over_the_prompt() -> None:
    text = "a" + "b" * 999_998 + "z"
    seen = guard_view(text)
    assert len(seen) == WINDOWS * WINDOW_CHARS + WINDOWS - 1
    assert seen.startswith("a") and seen.endswith("z") and guard_view(text) == seen


def test_repetition_in_the_middle_of_a_long_prompt_is_seen() -> None:
    text = make_document(1300) + " " + "tea " * 20_000 + make_document(500, seed=1)
    assert "repetitive_prompt" in assess(text)[1]


def test_cost_does_not_grow_with_prompt_length() -> None:
    at_bound, huge = make_document(2 * VIEW_CHARS), make_document(100_000) * 10
    guard = AnomalyGuard()

    def best_of(text: str) -> float:
        times = []
        for _ in range(20):
            start = time.perf_counter()
            guard.prompt_signals(text)
            times.append(time.perf_counter() - start)
        return min(times)

    assert best_of(huge) < 3 * best_of(at_bound)


def test_phrases_searched_near_their_anchors_match_a_full_search() -> None:
    pieces = (
        *("repeat", "write", "keep", "going", "forever", "never", "stop", "writing", "count"),
        *("counting", "to", "a", "one", "million", "infinite", "endless", "list", "story"),
        *("as", "many", "possible", "you", "can", "longest", "answer", "without", "end", "the"),
        *("of", "tea", "and", "then", "please", "non-stop", "nonstop", "ad", "infinitum"),
        *("until", "time", "1,000,000", "max", "length", ".", ",", "!", "\n", "don't", "from"),
        *("up", "the-quiet-harbour-museum-was-painted-after-the-long-summer"),
    )
    rng = random.Random(7)
    for _ in range(3000):
        view = guard_view(" ".join(rng.choice(pieces) for _ in range(rng.randint(1, 80))))
        vocabulary = read(view).vocabulary.keys()
        for phrase in (*_ENDLESS, _INFLATION):
            assert phrase.search(view, vocabulary) == bool(phrase.pattern.search(view)), view


@pytest.mark.parametrize(
    "text",
    [
        "Write a 4000-word doc on how our team onboards new engineers.",
        "Write me a 2,000-word essay on the history of the printing press.",
        "I need 3000 words on urban beekeeping for the newsletter.",
        "Write a 5,000-word short story about a lighthouse keeper.",
        "Write a 10-page report on the harbour renovation.",
        "Summarise: a typical book is around 300 pages long, so 130000000 books hold "
        "39000000000 pages in all.",  # numbers in a document are no ask
        "In 2015 Page became the CEO of Alphabet. Explain what changed.",
    ],
)
def test_long_form_asks_and_document_numbers_are_not_enormous(text: str) -> None:
    assert assess(text)[1] == ()


@pytest.mark.parametrize(
    "text",
    [
        "Write a 10,000-word essay about tea.",
        "Give me 50,000 baby names.",
        "Write a million words about owls.",
        "Write a 20 page report on bridges.",
        "Please produce 300 paragraphs describing rain.",
    ],
)
def test_absurd_asks_are_enormous(text: str) -> None:
    assert assess(text)[1] == ("enormous_output",)
    assert GuardConfig().enormous_tokens == 8192  # the default model's context


@pytest.mark.parametrize(
    "text",
    [
        "Kannst du mir bitte eine kurze E-Mail an meinen Vermieter schreiben? Die Heizung in "
        "meiner Wohnung funktioniert seit drei Tagen nicht mehr, und ich möchte, dass er so "
        "schnell wie möglich einen Techniker schickt.",
        "Erkläre mir den Unterschied zwischen Photosynthese und Zellatmung, mit einfachen "
        "Beispielen aus dem Alltag.",
        "Peux-tu m'aider à rédiger une lettre de motivation pour un poste de développeur web "
        "dans une petite entreprise à Lyon ? J'ai trois ans d'expérience avec React et Node.js.",
        "¿Podrías explicarme cómo funciona el sistema de pensiones en España y qué debo hacer "
        "para calcular cuánto voy a cobrar cuando me jubile?",
        "Помоги мне составить план путешествия по Золотому кольцу России на пять дней. Я поеду "
        "на машине с двумя детьми и хочу посмотреть самые интересные города.",
        "请帮我写一封邮件给房东，说明厨房的水管已经漏水三天了，希望他这周能安排师傅上门维修。",
        "把下面这段话翻译成英文：人工智能技术发展迅速，正在改变医疗、教育和交通等行业。",
        "来週の会議で使うプレゼンテーションの構成を考えてください。テーマは新しい顧客管理システム"
        "の導入で、時間は十五分程度です。",
        "서울에서 가족과 함께 주말에 가볼 만한 곳을 추천해 주세요. 아이들이 초등학생이라서 너무 "
        "멀지 않은 곳이면 좋겠습니다.",
        "Mi puoi consigliare un itinerario di una settimana in Sicilia? Vorrei vedere il mare, "
        "qualche città storica e mangiare bene senza spendere troppo.",
        "Czy możesz mi pomóc napisać krótkie ogłoszenie o sprzedaży roweru? Rower jest prawie "
        "nowy, ma dwadzieścia jeden biegów i kosztował dwa tysiące złotych.",
        "Kun je een recept geven voor een eenvoudige vegetarische lasagne die ik vanavond voor "
        "zes personen kan maken? Ik heb geen oven met grill.",
        "هل يمكنك أن تشرح لي الفرق بين الذكاء الاصطناعي والتعلم الآلي بطريقة بسيطة؟ أنا طالب في "
        "السنة الأولى في الجامعة.",
        "क्या आप मुझे बता सकते हैं कि घर पर स्वादिष्ट पनीर बटर मसाला कैसे बनाया जाता है? मेरे पास केवल एक घंटा है।",
        "ช่วยเขียนอีเมลถึงลูกค้าเพื่อแจ้งว่าสินค้าจะจัดส่งล่าช้าไปสองวัน",  # no list: unjudged
    ],
)
def test_real_text_in_any_language_is_not_gibberish(text: str) -> None:
    assert assess(text)[1] == ()
    assert assess(text * 400)[1] in ((), ("repetitive_prompt",))  # long: windows, CJK sampled


@pytest.mark.parametrize(
    "text",
    [  # random ids of the serving tokenizer, decoded (the guard benchmark's gibberish)
        "erccellpaymentNov Lambertag logs PractitionUpvotes delegated mathematicalpropsVal "
        "towels privacycanvas Poems corpserov Revised[(erstis='abytes Smart circul accessory "
        "transparency Cin Fig attackersGeneralrenpound growing suprasell toolkit",
        "isational Mist examinations nourishing adventure includeTo male approving oxytocin法"
        "ridgeURR soybeansaum stool Adolescentinet Power CSVenabled子 escalating pledged "
        "allowing malwareSov Heather quarterlyogo monumental Métisorption tension outfits",
    ],
)
def test_token_salad_stays_gibberish(text: str) -> None:
    assert "gibberish" in assess(text)[1]
    rng = random.Random(1)
    letters = " ".join(
        "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9)))
        for _ in range(4000)
    )
    framed = "Please tidy up these notes for me:\n" + letters + "\nThanks a lot!"
    assert "gibberish" in assess(framed)[1]  # read in the middle, not only at the ends
