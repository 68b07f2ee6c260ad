"""The toy corpus: deterministic, disjoint splits, and not a copy task."""

from pathlib import Path

from aiayn.data.toy import VERBS, generate_pairs, number_words, write_toy_corpus


def test_deterministic_given_seed() -> None:
    assert generate_pairs(200, seed=7) == generate_pairs(200, seed=7)
    assert generate_pairs(200, seed=7) != generate_pairs(200, seed=8)


def test_number_words_put_units_before_tens_in_german() -> None:
    assert number_words(42, "en") == "forty two"
    assert number_words(42, "de") == "zweiundvierzig"
    assert number_words(21, "de") == "einundzwanzig"
    assert number_words(17, "de") == "siebzehn"
    assert number_words(90, "en") == "ninety"


def test_needs_reordering_and_variable_length() -> None:
    pairs = generate_pairs(500, seed=3)
    present = {en: de for en, _, de, _ in VERBS}
    clauses = [(en, de) for en, de in pairs if " says that " in en]
    assert clauses
    for en, de in clauses:
        # English keeps the verb before the object; German moves it to the end of the clause.
        en_verb = next(word for word in en.split()[3:] if word in present)
        assert en.split()[-1].rstrip(".") != en_verb
        assert de.split()[-1].rstrip(".") == present[en_verb]
    assert sum(len(en.split()) != len(de.split()) for en, de in pairs) > 100
    assert all(en != de for en, de in pairs)


def test_write_toy_corpus_disjoint_splits(tmp_path: Path) -> None:
    write_toy_corpus(tmp_path, {"train": 100, "val": 20, "test": 20}, seed=1)
    lines = {
        s: (tmp_path / f"{s}.en").read_text("utf-8").splitlines() for s in ("train", "val", "test")
    }
    assert [len(v) for v in lines.values()] == [100, 20, 20]
    assert len(set().union(*lines.values())) == 140
    assert len((tmp_path / "val.de").read_text("utf-8").splitlines()) == 20
