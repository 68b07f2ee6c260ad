"""prepare(): cache reuse and invalidation, filtering, atomicity, readers, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest

from aiayn.data import prepare as prepare_module
from aiayn.data.config import DataConfig, TokenizerConfig
from aiayn.data.prepare import load_manifest, prepare
from aiayn.data.tokenizer import Tokenizers
from aiayn.errors import DataError

from .conftest import SIZES

MakeCfg = Callable[..., DataConfig]


def cache_entries(cfg: DataConfig) -> list[str]:
    """What the cache directory holds, besides the lock files that let one process prepare."""
    return sorted(p.name for p in Path(cfg.cache_dir).iterdir() if p.name != ".locks")


def test_second_run_reuses_cache(files_cfg: MakeCfg, monkeypatch: pytest.MonkeyPatch) -> None:
    path = prepare(files_cfg())
    manifest = load_manifest(path)
    assert manifest is not None and manifest["splits"]["val"]["examples"] == SIZES["val"]
    monkeypatch.setattr(prepare_module, "_build", lambda *args: pytest.fail("rebuilt"))
    assert prepare(files_cfg()) == path


def test_changed_input_or_setting_rebuilds(files_cfg: MakeCfg, corpus_dir: Path) -> None:
    path = prepare(files_cfg())
    assert prepare(files_cfg(max_len=30)) != path
    assert prepare(files_cfg(tokenizer=TokenizerConfig(vocab_size=250, min_frequency=1))) != path
    with (corpus_dir / "val.de").open("a", encoding="utf-8") as file:
        file.write("Ein neuer Satz.\n")
    with (corpus_dir / "val.en").open("a", encoding="utf-8") as file:
        file.write("A new sentence.\n")
    rebuilt = prepare(files_cfg())
    assert rebuilt != path
    assert load_manifest(rebuilt)["splits"]["val"]["examples"] == SIZES["val"] + 1
    assert prepare(files_cfg(max_tokens=512)) == rebuilt  # batching is not part of the key


def test_same_size_edit_with_restored_mtime_rebuilds(files_cfg: MakeCfg, corpus_dir: Path) -> None:
    """The key hashes content: `cp -p` / `rsync -t` style edits are not missed."""
    path = prepare(files_cfg())
    target = corpus_dir / "val.de"
    stat = target.stat()
    text = target.read_text(encoding="utf-8")
    swapped = text.replace("a", "e", 1) if "a" in text else text.replace("e", "a", 1)
    assert len(swapped.encode()) == len(text.encode()) and swapped != text
    target.write_text(swapped, encoding="utf-8")
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert prepare(files_cfg()) != path


def test_a_rewrite_with_the_same_bytes_keeps_the_cache(
    files_cfg: MakeCfg, corpus_dir: Path, tmp_path: Path
) -> None:
    """The key is the content of the corpus files and of a given tokenizer, not their stat:
    a file written again with the same bytes (a new inode and times: a copy, a checkout,
    every rank of an `init_from` run writing the same tokenizer) reuses the cache (issue 49;
    on f5393e6 each rewrite rebuilt it)."""
    path = prepare(files_cfg())
    given = tmp_path / "given" / "tokenizer.json"
    given.parent.mkdir()
    given.write_bytes((path / "tokenizer.json").read_bytes())
    with_tokenizer = prepare(files_cfg(tokenizer=TokenizerConfig(path=str(given.parent))))
    for target in (corpus_dir / "val.de", given):
        content = target.read_bytes()
        target.unlink()
        target.write_bytes(content)
        os.utime(target, ns=(1, 1))
    assert prepare(files_cfg()) == path
    assert prepare(files_cfg(tokenizer=TokenizerConfig(path=str(given.parent)))) == with_tokenizer
    copy = tmp_path / "copy" / "tokenizer.json"  # the same tokenizer in another directory
    copy.parent.mkdir()
    copy.write_bytes(given.read_bytes())
    assert prepare(files_cfg(tokenizer=TokenizerConfig(path=str(copy.parent)))) == with_tokenizer


def test_train_is_filtered_val_is_truncated(files_cfg: MakeCfg, corpus_dir: Path) -> None:
    long = " ".join(["Hund"] * 40)
    extra = [("", "Leer."), ("Empty.", "  "), (long, long), ("Anna.", "Anna sieht " + long[:60])]
    for name, side in (("train.en", 0), ("train.de", 1)):
        with (corpus_dir / name).open("a", encoding="utf-8") as file:
            file.writelines(pair[side] + "\n" for pair in extra)
    with (corpus_dir / "val.en").open("a", encoding="utf-8") as file:
        file.write(long + "\n")
    with (corpus_dir / "val.de").open("a", encoding="utf-8") as file:
        file.write("Hund.\n")
    path = prepare(files_cfg(max_len=32, max_ratio=3.0))
    splits = load_manifest(path)["splits"]
    assert splits["train"]["filtered"] == {"empty": 2, "too_long": 1, "ratio": 1}
    assert splits["train"]["examples"] == SIZES["train"]
    assert splits["val"] == {**splits["val"], "examples": SIZES["val"] + 1, "truncated": 1}
    offsets = np.load(path / "val.src.offsets.npy")
    assert offsets[-1] - offsets[-2] == 32
    texts = (path / "val.jsonl").read_text(encoding="utf-8").splitlines()
    assert json.loads(texts[-1]) == {"src": long, "tgt": "Hund."}  # original text kept


def test_separate_tokenizers_learn_their_own_side(files_cfg: MakeCfg, corpus_dir: Path) -> None:
    """joint=false: each side's vocabulary is the one learnt from that side's train text
    alone (the train split is streamed once per tokenizer), and the ids decode to the text."""
    from aiayn.data.tokenizer import train_tokenizer

    settings = TokenizerConfig(vocab_size=300, min_frequency=1, joint=False)
    path = prepare(files_cfg(tokenizer=settings))
    tokenizers = Tokenizers.load(path)
    assert not tokenizers.joint
    for side, lang in (("src", "en"), ("tgt", "de")):
        lines = (corpus_dir / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        alone = train_tokenizer(iter(lines), settings, len(lines))
        assert getattr(tokenizers, side).get_vocab() == alone.get_vocab(), side
    assert tokenizers.src.get_vocab() != tokenizers.tgt.get_vocab()
    val = (corpus_dir / "val.de").read_text(encoding="utf-8").splitlines()
    offsets, tokens = np.load(path / "val.tgt.offsets.npy"), np.load(path / "val.tgt.tokens.npy")
    ids = [tokens[offsets[i] : offsets[i + 1]].tolist() for i in range(len(val))]
    assert tokenizers.decode(ids, "tgt") == val


def test_the_train_split_is_streamed_never_read_whole(
    files_cfg: MakeCfg, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WMT-size corpora: prepare never holds the train split's text in memory."""
    from aiayn.data.sources.base import Source

    whole = Source.read

    def read(self: Source, role: str) -> tuple[list[str], list[str]]:
        assert role != "train", "the train split was read into memory"
        return whole(self, role)

    monkeypatch.setattr(Source, "read", read)
    path = prepare(files_cfg())
    assert load_manifest(path)["splits"]["train"]["examples"] == SIZES["train"]


def test_interrupted_prepare_leaves_no_trusted_cache(
    files_cfg: MakeCfg, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = prepare_module._write_texts

    def crash(out: Path, role: str, *args: object) -> None:
        if role == "test":
            raise KeyboardInterrupt
        original(out, role, *args)

    monkeypatch.setattr(prepare_module, "_write_texts", crash)
    cfg = files_cfg()
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg)
    assert cache_entries(cfg) == []
    assert load_manifest(prepare_module.cache_path(cfg)) is None
    monkeypatch.setattr(prepare_module, "_write_texts", original)
    assert load_manifest(prepare(cfg)) is not None


def test_racing_prepares_end_with_one_cache(
    files_cfg: MakeCfg, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the lock file does not hold (some network filesystems), two processes preparing
    at once still end with one complete cache: the second rename loses and uses the first."""
    monkeypatch.setattr(prepare_module, "_only_one_preparing", lambda path: nullcontext())
    original = prepare_module._build
    cfg = files_cfg()

    def build_while_another_finishes(config: DataConfig, out: Path) -> dict:
        monkeypatch.setattr(prepare_module, "_build", original)
        prepare(config)  # the other process wins the rename
        return original(config, out)

    monkeypatch.setattr(prepare_module, "_build", build_while_another_finishes)
    path = prepare(cfg)
    assert cache_entries(cfg) == [path.name]
    assert load_manifest(path) is not None


PREPARE_AND_SAY_WHETHER_BUILT = """
import sys
from aiayn.data import prepare as module
from aiayn.data.config import DataConfig, TokenizerConfig

built = []
original = module._build
module._build = lambda cfg, out: built.append(1) or original(cfg, out)
config = DataConfig(
    source="toy", cache_dir=sys.argv[1], tokenizer=TokenizerConfig(vocab_size=300)
)
path = module.prepare(config)
print("built" if built else "read", path)
"""


def test_processes_started_together_prepare_once(tmp_path: Path) -> None:
    """Three processes (the ranks of a torchrun or srun launch) prepare one corpus at once:
    one builds the cache, the others wait for it and read it."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    command = [sys.executable, "-c", PREPARE_AND_SAY_WHETHER_BUILT, str(tmp_path)]
    processes = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) for _ in range(3)
    ]
    said = sorted(process.communicate(timeout=300)[0].split() for process in processes)
    assert all(process.returncode == 0 for process in processes)
    assert [word for word, _ in said] == ["built", "read", "read"]
    assert len({path for _, path in said}) == 1
    assert load_manifest(Path(said[0][1])) is not None


def test_tsv_and_jsonl_sources(files_cfg: MakeCfg, corpus_dir: Path) -> None:
    files: dict[str, dict[str, list[str]]] = {"tsv": {}, "jsonl": {}}
    for role in SIZES:
        en = (corpus_dir / f"{role}.en").read_text("utf-8").splitlines()
        de = (corpus_dir / f"{role}.de").read_text("utf-8").splitlines()
        rows = ["id\ttext_de\ttext_en"] + [
            f"{i}\t{d}\t{e}" for i, (e, d) in enumerate(zip(en, de, strict=True))
        ]
        (corpus_dir / f"{role}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
        records = [
            json.dumps({"translation": {"en": e, "de": d}}) for e, d in zip(en, de, strict=True)
        ]
        (corpus_dir / f"{role}.jsonl").write_text("\n".join(records) + "\n", encoding="utf-8")
        files["tsv"][role] = [f"{role}.tsv"]
        files["jsonl"][role] = [f"{role}.jsonl"]
    text = load_manifest(prepare(files_cfg()))
    tsv = load_manifest(
        prepare(files_cfg(files=files["tsv"], src_field="text_en", tgt_field="text_de"))
    )
    jsonl = load_manifest(prepare(files_cfg(files=files["jsonl"], parent_field="translation")))
    assert text["splits"] == tsv["splits"] == jsonl["splits"]


def test_hf_source_on_local_json(files_cfg: MakeCfg, corpus_dir: Path) -> None:
    data_files = {}
    for role, split in (("train", "train"), ("val", "validation"), ("test", "test")):
        en = (corpus_dir / f"{role}.en").read_text("utf-8").splitlines()
        de = (corpus_dir / f"{role}.de").read_text("utf-8").splitlines()
        records = [
            json.dumps({"translation": {"de": d, "en": e}}) for e, d in zip(en, de, strict=True)
        ]
        (corpus_dir / f"{split}.json").write_text("\n".join(records) + "\n", encoding="utf-8")
        data_files[split] = str(corpus_dir / f"{split}.json")
    cfg = files_cfg(
        source="hf",
        hf={"name": "json", "data_files": data_files},
        parent_field="translation",
        val_split="validation",
    )
    hf = load_manifest(prepare(cfg))
    assert hf["splits"] == load_manifest(prepare(files_cfg()))["splits"]


def test_unequal_line_counts(files_cfg: MakeCfg, corpus_dir: Path) -> None:
    with (corpus_dir / "train.de").open("a", encoding="utf-8") as file:
        file.write("Noch ein Satz.\n")
    with pytest.raises(DataError, match=r"train\.en has 300 lines but .*train\.de has 301"):
        prepare(files_cfg())


def test_missing_file(files_cfg: MakeCfg, corpus_dir: Path) -> None:
    (corpus_dir / "test.de").unlink()
    with pytest.raises(DataError, match=r"test\.de not found"):
        prepare(files_cfg())


def test_empty_corpus(files_cfg: MakeCfg, corpus_dir: Path) -> None:
    for lang in ("en", "de"):
        (corpus_dir / f"train.{lang}").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match=r"train split .* is empty"):
        prepare(files_cfg())


def test_undecodable_bytes(files_cfg: MakeCfg, corpus_dir: Path) -> None:
    with (corpus_dir / "val.de").open("ab") as file:
        file.write("Gr\xfc\xdfe\n".encode("latin-1"))
    with (corpus_dir / "val.en").open("a", encoding="utf-8") as file:
        file.write("Greetings\n")
    with pytest.raises(DataError, match=r"val\.de, line 31: .*not UTF-8"):
        prepare(files_cfg())
    assert not Path(files_cfg().cache_dir).exists() or cache_entries(files_cfg()) == []


def test_given_tokenizer_is_used_and_checked(files_cfg: MakeCfg, tmp_path: Path) -> None:
    path = prepare(files_cfg())
    given = files_cfg(tokenizer=TokenizerConfig(path=str(path / "tokenizer.json")))
    reused = prepare(given)
    assert Tokenizers.load(reused).src.to_str() == Tokenizers.load(path).src.to_str()
    bad = json.loads((path / "tokenizer.json").read_text("utf-8"))
    vocab = bad["model"]["vocab"]
    vocab["<pad>"], vocab["<unk>"] = vocab["<unk>"], vocab["<pad>"]
    for token in bad["added_tokens"]:
        token["id"] = vocab[token["content"]]
    (tmp_path / "bad.json").write_text(json.dumps(bad), encoding="utf-8")
    with pytest.raises(DataError, match="special token ids"):
        prepare(files_cfg(tokenizer=TokenizerConfig(path=str(tmp_path / "bad.json"))))


def test_config_errors_name_the_field(files_cfg: MakeCfg) -> None:
    with pytest.raises(ValueError, match=r"max_tokens=33 is smaller than .*max_len \+ 2 = 34"):
        files_cfg(max_len=32, max_tokens=33)
    with pytest.raises(ValueError, match=r"DataConfig\.files"):
        files_cfg(files={"train": ["a", "b"]})
    with pytest.raises(ValueError, match=r"DataConfig\.source"):
        files_cfg(source="wmt")


def test_everything_filtered(files_cfg: MakeCfg) -> None:
    with pytest.raises(DataError, match="every train pair was filtered out"):
        prepare(files_cfg(max_len=2, max_tokens=64))


def test_command_line_prepares_toy(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "aiayn.data.prepare",
        f"data.cache_dir={tmp_path}",
        "data.toy.train_size=200",
        "data.toy.val_size=20",
        "data.toy.test_size=20",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    assert "train:       200 of       200 pairs" in result.stdout
    assert len(list(tmp_path.glob("toy-en-de-*/manifest.json"))) == 1


def test_preparation_shows_a_bar_per_stage_on_a_terminal(files_cfg: MakeCfg, terminal) -> None:
    prepare(files_cfg())
    drawn = terminal()
    total = sum(SIZES.values())  # the pairs of every split are encoded
    for stage, done in (("read splits", "3/3"), ("train tokenizer", "1/1")):
        assert stage in drawn and done in drawn, stage
    assert "encode" in drawn and f"{total}/{total}" in drawn
    assert "write cache" in drawn


def test_preparation_is_quiet_when_disabled(files_cfg: MakeCfg, terminal) -> None:
    from aiayn import console

    console.set_progress(False)  # train.py: trainer.enable_progress_bar=false; prepare: progress
    prepare(files_cfg())
    assert terminal() == ""


def test_preparation_is_quiet_off_a_terminal(
    files_cfg: MakeCfg, capfd: pytest.CaptureFixture[str]
) -> None:
    prepare(files_cfg())  # pytest's stderr is not a terminal
    assert "encode" not in capfd.readouterr().err


def test_some_empty_references_are_counted_in_a_warning(
    files_cfg: MakeCfg, corpus_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = (corpus_dir / "test.de").read_text(encoding="utf-8").splitlines()
    lines[:3] = ["", " ", ""]
    (corpus_dir / "test.de").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with caplog.at_level("WARNING", logger="aiayn.data.prepare"):
        prepare(files_cfg())
    assert f"3 of {SIZES['test']} references are empty" in caplog.text
    assert "data.test_split=test" in caplog.text and "test.de" in caplog.text
