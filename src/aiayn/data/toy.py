"""The embedded toy corpus: a deterministic, rule-based English -> German translation task.

Every English sentence has exactly one German translation (no synonyms); sentences have 5-11
words over a closed vocabulary of about 350 words. The rules need reordering and
variable-length alignment, not copying:

- Numbers 2-99 (always with a plural noun): English "forty two" (two words) -> German
  "zweiundvierzig" (one word, units before tens; 21, 31, ... use "einund-").
- Nouns have a gender (m/f/n) and a German plural ("dogs" -> "Hunde", "houses" -> "Häuser").
- Adjective agreement: after the definite article the adjective ends in -e in the nominative
  singular and for feminine/neuter accusative, -en for masculine accusative ("den roten Hund")
  and in the plural; without an article (after a number) it ends in -e ("zwei rote Hunde").
- Articles by gender and case: der/die/das (nominative), den/die/das (accusative).
- Templates (S subject: a name or "the ADJ NOUN"; O object: "the ADJ NOUN" or
  "NUMBER ADJ NOUNS"; V a verb in the present, Vp in the past):
    1. "S V O."                     -> "S V O."
    2. "yesterday S Vp O."          -> "gestern Vp S O."            (verb second: inversion)
       "today S V O."               -> "heute V S O."
    3. "NAME says that S V O."      -> "NAME sagt, dass S O V."      (verb-final clause)
       "NAME thinks that S Vp O."   -> "NAME denkt, dass S O Vp."
       "NAME knows that S V O."     -> "NAME weiß, dass S O V."

`generate_pairs(n, seed)` draws n distinct pairs; `write_toy_corpus` writes the train/val/test
splits (disjoint) as line-aligned `{split}.en` / `{split}.de` files, which then follow the same
path as every other corpus.
"""

from __future__ import annotations

import random
from pathlib import Path

# (en singular, en plural, de singular, de plural, gender)
NOUNS = (
    ("dog", "dogs", "Hund", "Hunde", "m"),
    ("cat", "cats", "Katze", "Katzen", "f"),
    ("house", "houses", "Haus", "Häuser", "n"),
    ("car", "cars", "Auto", "Autos", "n"),
    ("bird", "birds", "Vogel", "Vögel", "m"),
    ("apple", "apples", "Apfel", "Äpfel", "m"),
    ("book", "books", "Buch", "Bücher", "n"),
    ("flower", "flowers", "Blume", "Blumen", "f"),
    ("horse", "horses", "Pferd", "Pferde", "n"),
    ("tree", "trees", "Baum", "Bäume", "m"),
    ("table", "tables", "Tisch", "Tische", "m"),
    ("lamp", "lamps", "Lampe", "Lampen", "f"),
    ("child", "children", "Kind", "Kinder", "n"),
    ("teacher", "teachers", "Lehrer", "Lehrer", "m"),
    ("ball", "balls", "Ball", "Bälle", "m"),
    ("cup", "cups", "Tasse", "Tassen", "f"),
    ("boat", "boats", "Boot", "Boote", "n"),
    ("chair", "chairs", "Stuhl", "Stühle", "m"),
    ("bottle", "bottles", "Flasche", "Flaschen", "f"),
    ("window", "windows", "Fenster", "Fenster", "n"),
)
ADJECTIVES = (
    ("red", "rot"),
    ("blue", "blau"),
    ("green", "grün"),
    ("big", "groß"),
    ("small", "klein"),
    ("old", "alt"),
    ("new", "neu"),
    ("young", "jung"),
    ("fast", "schnell"),
    ("slow", "langsam"),
    ("warm", "warm"),
    ("cold", "kalt"),
    ("white", "weiß"),
    ("black", "schwarz"),
    ("yellow", "gelb"),
    ("beautiful", "schön"),
)
# (en present, en past, de present, de past)
VERBS = (
    ("sees", "saw", "sieht", "sah"),
    ("buys", "bought", "kauft", "kaufte"),
    ("finds", "found", "findet", "fand"),
    ("likes", "liked", "mag", "mochte"),
    ("paints", "painted", "malt", "malte"),
    ("sells", "sold", "verkauft", "verkaufte"),
    ("counts", "counted", "zählt", "zählte"),
    ("needs", "needed", "braucht", "brauchte"),
    ("carries", "carried", "trägt", "trug"),
    ("washes", "washed", "wäscht", "wusch"),
)
NAMES = ("Anna", "Ben", "Clara", "David", "Emma", "Felix", "Greta", "Hans", "Ida", "Jonas")
# (en, de, tense of the clause)
CLAUSE_VERBS = (
    ("says", "sagt", "present"),
    ("thinks", "denkt", "past"),
    ("knows", "weiß", "present"),
)

# (units, teens, tens) of each language, as space-separated words
_NUMBER_WORDS = {
    "en": (
        "zero one two three four five six seven eight nine",
        "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen",
        "_ _ twenty thirty forty fifty sixty seventy eighty ninety",
    ),
    "de": (
        "null ein zwei drei vier fünf sechs sieben acht neun",
        "zehn elf zwölf dreizehn vierzehn fünfzehn sechzehn siebzehn achtzehn neunzehn",
        "_ _ zwanzig dreißig vierzig fünfzig sechzig siebzig achtzig neunzig",
    ),
}
_ARTICLES = {
    ("m", "nom"): "der",
    ("f", "nom"): "die",
    ("n", "nom"): "das",
    ("m", "acc"): "den",
    ("f", "acc"): "die",
    ("n", "acc"): "das",
}


def number_words(n: int, lang: str) -> str:
    """2 <= n <= 99 in words: 42 -> 'forty two' (en), 'zweiundvierzig' (de: units first)."""
    units, teens, tens = (words.split() for words in _NUMBER_WORDS[lang])
    if n < 10:
        return units[n]
    if n < 20:
        return teens[n - 10]
    ten, unit = divmod(n, 10)
    if not unit:
        return tens[ten]
    return f"{tens[ten]} {units[unit]}" if lang == "en" else f"{units[unit]}und{tens[ten]}"


def _definite(rng: random.Random, case: str) -> tuple[str, str]:
    """'the ADJ NOUN' and its German form in `case` ('nom' or 'acc')."""
    noun_en, _, noun_de, _, gender = rng.choice(NOUNS)
    adj_en, adj_de = rng.choice(ADJECTIVES)
    ending = "en" if (gender, case) == ("m", "acc") else "e"
    return f"the {adj_en} {noun_en}", f"{_ARTICLES[gender, case]} {adj_de}{ending} {noun_de}"


def _subject(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.5:
        name = rng.choice(NAMES)
        return name, name
    en, de = _definite(rng, "nom")
    return en[0].upper() + en[1:], de[0].upper() + de[1:]


def _object(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.4:
        return _definite(rng, "acc")
    n = rng.randint(2, 99)
    _, plural_en, _, plural_de, _ = rng.choice(NOUNS)
    adj_en, adj_de = rng.choice(ADJECTIVES)
    return (
        f"{number_words(n, 'en')} {adj_en} {plural_en}",
        f"{number_words(n, 'de')} {adj_de}e {plural_de}",
    )


def _lower_first(text: str) -> str:
    return text if text.split()[0] in NAMES else text[0].lower() + text[1:]


def _pair(rng: random.Random) -> tuple[str, str]:
    """One (English, German) sentence pair drawn from the templates in the module docstring."""
    subj_en, subj_de = _subject(rng)
    obj_en, obj_de = _object(rng)
    verb_en, past_en, verb_de, past_de = rng.choice(VERBS)
    template = rng.randrange(3)
    if template == 0:
        return f"{subj_en} {verb_en} {obj_en}.", f"{subj_de} {verb_de} {obj_de}."
    if template == 1:
        if rng.random() < 0.5:
            en, de = f"yesterday {_lower_first(subj_en)} {past_en}", f"gestern {past_de}"
        else:
            en, de = f"today {_lower_first(subj_en)} {verb_en}", f"heute {verb_de}"
        en, de = f"{en} {obj_en}.", f"{de} {_lower_first(subj_de)} {obj_de}."
        return en[0].upper() + en[1:], de[0].upper() + de[1:]
    name = rng.choice(NAMES)
    clause_en, clause_de, tense = rng.choice(CLAUSE_VERBS)
    v_en, v_de = (verb_en, verb_de) if tense == "present" else (past_en, past_de)
    sub_en, sub_de = _lower_first(subj_en), _lower_first(subj_de)
    return (
        f"{name} {clause_en} that {sub_en} {v_en} {obj_en}.",
        f"{name} {clause_de}, dass {sub_de} {obj_de} {v_de}.",
    )


def generate_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """n distinct (English, German) pairs, a pure function of (n, seed)."""
    rng = random.Random(seed)
    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    while len(pairs) < n:
        en, de = _pair(rng)
        if en not in seen:
            seen.add(en)
            pairs.append((en, de))
    return pairs


def write_toy_corpus(directory: Path, sizes: dict[str, int], seed: int) -> None:
    """Write disjoint splits `{split}.en` / `{split}.de` (sizes: split -> pairs) to directory."""
    pairs = generate_pairs(sum(sizes.values()), seed)
    start = 0
    for split, size in sizes.items():
        chunk = pairs[start : start + size]
        start += size
        for lang, side in (("en", 0), ("de", 1)):
            text = "".join(pair[side] + "\n" for pair in chunk)
            (directory / f"{split}.{lang}").write_text(text, encoding="utf-8")
