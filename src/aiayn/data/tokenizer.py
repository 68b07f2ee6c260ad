"""Subword tokenizers (HF `tokenizers`) with the project's fixed special tokens.

Pipeline: NFKC (optional) + lowercase (optional) normalisation -> Metaspace pre-tokenizer
(spaces become '▁', so decoding restores them exactly) -> BPE or Unigram (SentencePiece's
unigram language model). Special tokens come from
`special.py` with ids 0-3; `encode` adds none, `decode` skips them. Characters never seen in
training become `<unk>` and are dropped by `decode`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from aiayn.data.config import TokenizerConfig
from aiayn.data.special import SPECIAL_TOKENS, UNK_TOKEN
from aiayn.errors import DataError, replace_text

SIDES = ("src", "tgt")
JOINT_FILE = "tokenizer.json"


def train_tokenizer(
    texts: Iterable[str], cfg: TokenizerConfig, length: int | None = None
) -> Tokenizer:
    """Train a `cfg.model` ('bpe' or 'unigram') tokenizer on texts (an iterator of sentences,
    `length` of them if known)."""
    bpe = cfg.model == "bpe"
    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN) if bpe else models.Unigram())
    steps = ([normalizers.NFKC()] if cfg.nfkc else []) + (
        [normalizers.Lowercase()] if cfg.lowercase else []
    )
    if steps:
        tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = (
        trainers.BpeTrainer(
            vocab_size=cfg.vocab_size,
            min_frequency=cfg.min_frequency,
            special_tokens=list(SPECIAL_TOKENS),
            show_progress=False,
        )
        if bpe
        else trainers.UnigramTrainer(
            vocab_size=cfg.vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            unk_token=UNK_TOKEN,
            show_progress=False,
        )
    )
    tokenizer.train_from_iterator(texts, trainer, length=length)
    return tokenizer


def check_specials(tokenizer: Tokenizer, origin: str) -> Tokenizer:
    """Return tokenizer if `<pad>,<bos>,<eos>,<unk>` have ids 0-3, else raise DataError."""
    found = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    expected = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    if found != expected:
        raise DataError(
            f"tokenizer {origin} has special token ids {found}, but this project needs "
            f"{expected} (see aiayn/data/special.py): retrain it with these special tokens "
            f"first, or unset data.tokenizer.path to train one"
        )
    return tokenizer


class Tokenizers:
    """The source and target tokenizers; one shared object when `joint`.

    encode(texts, side) -> ids per text (no special tokens); decode(ids, side) -> text per row
    (special tokens skipped, detokenized).
    """

    def __init__(self, src: Tokenizer, tgt: Tokenizer | None = None) -> None:
        self.src = check_specials(src, "src")
        self.tgt = self.src if tgt is None else check_specials(tgt, "tgt")

    @property
    def joint(self) -> bool:
        return self.src is self.tgt

    @property
    def src_vocab_size(self) -> int:
        return self.src.get_vocab_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt.get_vocab_size()

    def lowercases(self, side: str) -> bool:
        """Whether `side` lowercases its input (then score BLEU on lowercased references)."""
        return "Lowercase" in repr(self._side(side).normalizer)

    def _side(self, side: str) -> Tokenizer:
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, got {side!r}")
        return self.src if side == "src" else self.tgt

    def encode(self, texts: list[str], side: str) -> list[list[int]]:
        """Token ids of each text (batch encode, parallel in Rust), no special tokens."""
        encodings = self._side(side).encode_batch(texts, add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: list[list[int]], side: str) -> list[str]:
        """Detokenized text of each id row, special tokens skipped."""
        return self._side(side).decode_batch(ids, skip_special_tokens=True)

    def save(self, directory: Path | str) -> list[Path]:
        """Write `tokenizer.json` (joint) or `tokenizer.src.json` + `tokenizer.tgt.json`, each
        atomically (`replace_text`): every rank of a run may write the same files at once, and
        none reads a part of one."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, text in self.state().items():
            path = directory / (JOINT_FILE if name == "joint" else f"tokenizer.{name}.json")
            replace_text(path, text)
            paths.append(path)
        return paths

    @classmethod
    def load(cls, directory: Path | str) -> Tokenizers:
        """Read what `save` wrote (or a single tokenizer.json file: joint)."""
        path = Path(directory)
        if path.is_file():
            return cls(_read(path))
        if (path / JOINT_FILE).is_file():
            return cls(_read(path / JOINT_FILE))
        return cls(_read(path / "tokenizer.src.json"), _read(path / "tokenizer.tgt.json"))

    def state(self) -> dict[str, str]:
        """JSON strings, {'joint': ...} or {'src': ..., 'tgt': ...} (for checkpoints)."""
        if self.joint:
            return {"joint": self.src.to_str()}
        return {"src": self.src.to_str(), "tgt": self.tgt.to_str()}

    @classmethod
    def from_state(cls, state: dict[str, str]) -> Tokenizers:
        """Inverse of `state`."""
        if "joint" in state:
            return cls(Tokenizer.from_str(state["joint"]))
        return cls(Tokenizer.from_str(state["src"]), Tokenizer.from_str(state["tgt"]))


def _read(path: Path) -> Tokenizer:
    if not path.is_file():
        raise DataError(f"tokenizer file {path} not found: check data.tokenizer.path")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises a bare Exception on bad JSON
        raise DataError(f"cannot read tokenizer {path}: {error}") from error
