"""BPE and Unigram tokenizers: fixed special ids, round trips, save/load/state."""

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models

from aiayn.data.config import TokenizerConfig
from aiayn.data.special import BOS, EOS, PAD, SPECIAL_TOKENS, UNK
from aiayn.data.tokenizer import Tokenizers, train_tokenizer
from aiayn.data.toy import generate_pairs
from aiayn.errors import DataError

PAIRS = generate_pairs(300, seed=0)
EXTRA = ["Straße, Café und Ärger — 42 % (ok)?", "Zwei  Leerzeichen und\ttab."]
SRC = [en for en, _ in PAIRS] + EXTRA
TGT = [de for _, de in PAIRS] + EXTRA
CFG = TokenizerConfig(vocab_size=400, min_frequency=1)


@pytest.fixture(scope="module")
def joint() -> Tokenizers:
    return Tokenizers(train_tokenizer(SRC + TGT, CFG))


def test_special_ids_are_fixed(joint: Tokenizers) -> None:
    assert [joint.src.token_to_id(token) for token in SPECIAL_TOKENS] == [PAD, BOS, EOS, UNK]


def test_round_trip_text_ids_text(joint: Tokenizers) -> None:
    for side, texts in (("src", SRC), ("tgt", TGT)):
        ids = joint.encode(texts, side)
        assert all(min(row) > UNK for row in ids)  # no specials added
        assert joint.decode(ids, side) == texts


def test_decode_skips_specials(joint: Tokenizers) -> None:
    ids = joint.encode(["Anna sieht zwei Hunde."], "tgt")[0]
    assert joint.decode([[BOS, *ids, EOS, PAD, PAD]], "tgt") == ["Anna sieht zwei Hunde."]


def test_separate_vocabularies_save_load_state(tmp_path: Path, joint: Tokenizers) -> None:
    separate = Tokenizers(train_tokenizer(SRC, CFG), train_tokenizer(TGT, CFG))
    assert not separate.joint and joint.joint
    assert separate.src.get_vocab() != separate.tgt.get_vocab()
    names = [path.name for path in separate.save(tmp_path / "sep")]
    assert names == ["tokenizer.src.json", "tokenizer.tgt.json"]
    assert [path.name for path in joint.save(tmp_path / "joint")] == ["tokenizer.json"]
    for original, restored in (
        (separate, Tokenizers.load(tmp_path / "sep")),
        (joint, Tokenizers.load(tmp_path / "joint")),
        (joint, Tokenizers.load(tmp_path / "joint" / "tokenizer.json")),
        (separate, Tokenizers.from_state(separate.state())),
        (joint, Tokenizers.from_state(joint.state())),
    ):
        assert restored.joint == original.joint
        for side in ("src", "tgt"):
            assert restored.encode(SRC[:20], side) == original.encode(SRC[:20], side)


def test_lowercase_and_nfkc() -> None:
    cfg = TokenizerConfig(vocab_size=200, min_frequency=1, lowercase=True)
    tokenizers = Tokenizers(train_tokenizer(SRC, cfg))
    assert tokenizers.decode(tokenizers.encode(["Anna ＳＥＥＳ"], "src"), "src") == ["anna sees"]


def test_wrong_special_tokens_are_rejected(tmp_path: Path) -> None:
    other = Tokenizer(models.BPE(unk_token="[UNK]"))
    other.add_special_tokens(["[UNK]", "<pad>", "<s>", "</s>"])
    other.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(DataError, match="special token ids"):
        Tokenizers.load(tmp_path)
    with pytest.raises(DataError, match="not found"):
        Tokenizers.load(tmp_path / "missing")


@pytest.fixture(scope="module")
def unigram() -> Tokenizers:
    return Tokenizers(train_tokenizer(SRC + TGT, TokenizerConfig(vocab_size=300, model="unigram")))


def test_unigram_keeps_the_special_token_contract_and_round_trips(unigram, tmp_path) -> None:
    assert [unigram.src.token_to_id(token) for token in SPECIAL_TOKENS] == [PAD, BOS, EOS, UNK]
    assert unigram.src_vocab_size == 300
    assert "Unigram" in unigram.src.to_str()[:2000]
    ids = unigram.encode(SRC, "src")
    assert all(min(row) > UNK for row in ids)
    assert unigram.decode(ids, "src") == SRC
    assert unigram.decode([[BOS, *ids[0], EOS, PAD]], "src") == [SRC[0]]
    unigram.save(tmp_path)
    assert Tokenizers.load(tmp_path).encode(SRC[:5], "src") == ids[:5]


def test_unigram_and_bpe_segment_differently(unigram, joint) -> None:
    assert unigram.encode(SRC[:50], "src") != joint.encode(SRC[:50], "src")


def test_unknown_tokenizer_model_is_named() -> None:
    with pytest.raises(ValueError, match=r"TokenizerConfig\.model='wordpiece'"):
        TokenizerConfig(model="wordpiece")
