"""Function words of 38 languages, and the share of a text's words they make up.

Every language spends a quarter to a half of its running text on a short closed class
(articles, particles, prepositions, pronouns, auxiliaries; for Chinese, Japanese and Korean,
characters: the commonest hanzi, the hiragana, the particle syllables), while random tokens
decode to a few percent under every list: the anomaly guard's `gibberish` signal reads
`function_word_share`. The share is per language (the best-matching one), never over the union
of the lists, so random text cannot add up stray hits across languages; CJK lists compete only
where CJK characters make up half the text or more. Words in scripts without a list are not
counted. Pure data and arithmetic: no I/O.
"""

from __future__ import annotations

import itertools
import re
import string
from collections import Counter
from dataclasses import dataclass

CJK_SAMPLE = 256  # CJK characters the function-word share reads at most, evenly strided

# Function words by language (ISO 639-1 code first); continuation lines are indented.
_FUNCTION_WORDS_TEXT = """
en the of and to a in is it you that he was for on are with as i his they be at one have this from
   or had by not but what some we can out other were all there when up use your how said an each
   she which do their if will way about many then them would so these her see him has more could go
   come my than who its did get may does me should any our into also been just am very
de der die das und in zu den von mit ist im für auf nicht sich des ein eine einen einem einer es
   dem auch als an wie bei aus er sie wir ich du ihr nach um oder so dass noch über vor nur aber
   wenn was man kann sind war hat wird werden mir mich mein meine bitte zum zur bis durch diese
   dieser mehr sehr uns habe
fr le la les de des du un une et est en à au aux que qui dans pour pas sur ne se ce il elle ils
   nous vous je tu on avec par plus son sa ses leur mais ou comme cette mon ma mes me lui y sont
   être été fait très tout l d qu j
es el la los las de del y en a que un una es por con para no se su sus lo al como más pero me mi te
   tu le les o este esta son está muy sobre hay ya yo ser entre cuando también porque sin
it il lo la i gli le di del della dei e è un una che in per con non si su da al alla come più ma mi
   ti ci sono anche questo questa io lui lei noi voi nel nella l
pt o a os as de do da dos das e é um uma que em no na nos nas para com não se por ao mais como mas
   eu você meu minha seu sua ele ela isso este esta são está muito pelo pela
ca el la els les de del i en a que un una és per amb no es seu seva com més però em al ho aquest
   aquesta són
nl de het een en van in is dat op te voor met niet zijn aan er die ik je u wat maar als bij om ook
   ze hij we naar dan of uit deze dit door kan wordt
sv och i att det som en på är av för med till den har de inte om ett han men var jag sig från vi så
   kan du
da og i at det som en på er af for med til den har de ikke om et han men var jeg sig fra vi så kan
   du
no og i å det som en på er av for med til den har de ikke om et han men var jeg seg fra vi så kan
   du
fi ja on ei se että oli hän mutta kun niin tai jos myös kuin joka ovat mitä minä sinä me te he tämä
   ole voi
pl i w nie na się z że do to jest jak a o co po ale tak za od dla przez jego czy mi już może są być
   ja ty my oraz jako
cs a se na je v že to s z do o k jako ale i by jsem jsou pro tak jak po co není jeho které který
   být
sk a sa na je v že to s z do o k ako ale i by som sú pre tak po čo nie jeho ktoré ktorý byť
hu a az és hogy nem is egy de van meg csak már el ez mint azt ki volt vagy még ha be most mi
ro și de în la a cu pe că un o nu se din care mai este sunt pentru ce ca sau dar al ale lui
hr i je u da se na za su od s ne koji to a ili kao iz ali što sam biti bi
tr bir ve bu da de için ile ne çok gibi daha ama o ben sen en mi mı değil var yok kadar olarak
   sonra her nasıl
id yang dan di ini itu dengan untuk dari tidak ke dalam akan pada juga saya ada atau bisa anda
   adalah
vi của và là có các những được cho trong một không với này để người đã khi thì tôi bạn như về đến
   từ
sw na ya wa kwa za la ni katika kwamba hii cha vya kama lakini pia au hiyo yake
tl ang ng sa na mga at ay si ko ako ka mo siya ito para hindi
ru и в не на я что с он а как по это к но из у за от о так все она же вы мы для бы ты его мне был
   до или если только еще уже когда при нет есть мой быть чтобы
uk і в не на я що з він а як по це до але із у за від о так все вона ж ви ми для б ти його мені був
   чи якщо тільки ще вже коли при є бути щоб та й
bg и в не на да се че с за от по е са като това той тя ние вие аз ти но или към при
sr и је у да се на за су од с не који то а или као из али што сам бити би
el και το η της του να με τα των για ο που σε στο στη από είναι δεν θα ως οι τη την ένα μια
ar في من على إلى أن هذا ما لا التي الذي عن مع هذه كان هو هي و أو ثم قد لم كل بين عند إذا كما هل
fa و در به از که این را با است برای آن یک می تا هم بر شود خود
ur کے میں کی ہے اور سے کو نہیں یہ ایک کا پر بھی ہیں تھا کہ جو
he של את על לא זה הוא עם כי גם מה אני היא יש אם או אל כל
hi है का की के में से और को यह एक पर भी हैं था कि नहीं तो ही या लिए कर मैं हम आप इस वह जो
mr आणि आहे या व हे की ते आहेत तो ती मी आम्ही तुम्ही एक ला ने
bn এবং এই না কি করে হয় থেকে জন্য আমি আমার তার একটি ও যে এর করা হবে
"""
_FUNCTION_CHARACTERS = {  # scripts without spaces between words, one unit a character
    "zh": "的一是不了在人有我他这个们中来上大为和国地到以说时要就出会可也你对生能而子那得于着下自之"
    "年过发后作里用道行所然家种事成方多经么去法学如都同现当没动面起看定天分还进好小部其些主样理"
    "心她本前开但因只从想实它与把被吗呢吧什怎请给让很最再更每們這個為說會對與從嗎麼請給讓還於過"
    "著裡樣來國時後動現當沒點開",  # the commonest characters: roughly 40 % of running text
    "ja": "".join(map(chr, range(0x3041, 0x3097))),  # the hiragana: particles and inflections
    "ko": "은는이가을를에의로도와과고서다요니습까지게면한하해있것수들",  # particles and endings
}
_FUNCTION_SETS = [
    frozenset(entry.split()[1:]) for entry in re.split(r"\n(?=\S)", _FUNCTION_WORDS_TEXT.strip())
] + [frozenset(characters) for characters in _FUNCTION_CHARACTERS.values()]
_LANGUAGES_OF = {  # word or character -> the indices of the languages whose lists hold it
    unit: tuple(i for i, units in enumerate(_FUNCTION_SETS) if unit in units)
    for unit in frozenset().union(*_FUNCTION_SETS)
}
_CJK = "\u3041-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_CJK_RUN = re.compile(f"[{_CJK}]+")
_NOT_WORDS = re.compile(f"[{_CJK}«»“”„‘’‹›¿¡—–…·•。、，．！？：；（）「」『』《》【】〈〉・]+")
_PUNCTUATION = "".join(c for c in string.punctuation if c != ",").encode()
_PUNCTUATION_TO_SPACE = bytes.maketrans(_PUNCTUATION, b" " * len(_PUNCTUATION))



@dataclass(frozen=True, slots=True)
class Reading:
    words: list[str]  # split at spaces and punctuation, commas dropped ("10,000" stays one)
    vocabulary: Counter[str]  # each word's count
    characters: str  # the CJK characters, or an even sample of CJK_SAMPLE of them
    num_characters: int  # how many CJK characters there are


def read(view: str) -> Reading:
    spaced = view.encode().translate(_PUNCTUATION_TO_SPACE, b",").decode()
    if spaced.isascii():
        words = spaced.split()
        return Reading(words, Counter(words), "", 0)
    words = _NOT_WORDS.sub(" ", spaced).split()
    characters = "".join(_CJK_RUN.findall(spaced))
    sample = characters[:: len(characters) // CJK_SAMPLE + 1]
    return Reading(words, Counter(words), sample, len(characters))


def function_word_share(reading: Reading) -> tuple[float, int]:
    """The share of function words of the best-matching language, and how many units it is of
    (words and CJK characters; the characters are counted from their sample)."""
    words = reading.vocabulary
    total = len(reading.words) - sum(itertools.compress(words.values(), map(str.isdigit, words)))
    if not "".join(words).isascii():
        total -= sum(n for w, n in words.items() if not _listed_script(w[0]) and not w.isdigit())
    hits = [0] * len(_FUNCTION_SETS)
    for word in words.keys() & _LANGUAGES_OF.keys():
        for language in _LANGUAGES_OF[word]:
            hits[language] += words[word]
    if reading.characters:
        scale = reading.num_characters / len(reading.characters)
        for character in set(reading.characters) & _LANGUAGES_OF.keys():
            for language in _LANGUAGES_OF[character]:
                hits[language] += round(reading.characters.count(character) * scale)
    units = total + reading.num_characters
    if not units:
        return 1.0, 0
    split = len(_FUNCTION_SETS) - len(_FUNCTION_CHARACTERS)  # word languages, then CJK ones
    best = max(hits[:split]) if 2 * total >= units else 0
    if 2 * reading.num_characters >= units:
        best = max(best, *hits[split:])
    return best / units, units


def _listed_script(first: str) -> bool:
    """Latin, Greek, Cyrillic, Hebrew, Arabic, Devanagari and Bengali: the lists' scripts."""
    return (
        first < "\u0250"
        or "\u0370" <= first < "\u0530"
        or "\u0590" <= first < "\u0780"
        or "\u0900" <= first < "\u0a00"
        or "\u1e00" <= first < "\u1f00"
    )
