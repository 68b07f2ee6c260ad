"""translate.py: file->file and stdin->stdout agree with translate_batch; blank lines keep
alignment; over-long lines truncate (warning) or fail (naming the line, keeping the output
so far); bad checkpoints and tokenizers fail clearly."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn.data.config import TokenizerConfig
from aiayn.data.dataset import collate_sources
from aiayn.data.tokenizer import Tokenizers, train_tokenizer
from aiayn.errors import CheckpointError, ConfigError, OutputError, TranslationError
from aiayn.inference import decode_config, load_checkpoint
from aiayn.inference.translate import run
from aiayn.model import DecodeConfig, generate
from tests.eval.conftest import reference_translations
from tests.helpers import CONFIG_ERRORS, REPO, compose_config

CPU = ["device=cpu", "batch_size=2"]
LONG = "seven " * 300  # > 255 tokens: over the tiny model's max_positions - 1


@pytest.fixture(scope="module")
def lines(sources: list[str]) -> list[str]:
    return [sources[0], "", sources[1], "   ", *sources[2:]]


def _read(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    return text.split("\n")[:-1]


def test_file_to_file_matches_translate_batch(ckpt, translator, lines, tmp_path):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    overrides = [f"ckpt_path={ckpt}", f"input={src}", f"output={out}", "batch_size=3"]
    assert run(compose_config("translate", [*overrides, "device=cpu"], tmp_path)) == len(lines)
    got = _read(out)
    assert got == reference_translations(translator, lines)
    assert got[1] == "" and got[3] == ""  # blank in, blank out: alignment kept
    assert all(got[i] for i in (0, 2, 4, 5))
    assert len(set(got)) > 2  # the output depends on the input


def test_stdin_to_stdout(ckpt, translator, lines, tmp_path):
    proc = subprocess.run(
        [sys.executable, "translate.py", f"ckpt_path={ckpt}", *CPU, f"paths.log_dir={tmp_path}"],
        input="\n".join(lines) + "\n",
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:-1] == reference_translations(translator, lines)


def test_decode_override_on_top_of_checkpoint(ckpt, translator, sources, tmp_path):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(sources[:3]) + "\n", encoding="utf-8")
    overrides = [f"ckpt_path={ckpt}", f"input={src}", f"output={out}", "device=cpu"]
    run(compose_config("translate", [*overrides, "decode=beam", "+decode.beam_size=2"], tmp_path))
    config = DecodeConfig(strategy="beam", beam_size=2)
    batch, _ = collate_sources(translator.tokenizers.encode(sources[:3], side="src"))
    hyps = generate(translator.model, batch, config)
    assert _read(out) == translator.tokenizers.decode([h[0].tokens for h in hyps], side="tgt")


def test_nbest_writes_n_scored_hypotheses_per_line_best_first(ckpt, lines, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    common = [f"ckpt_path={ckpt}", f"input={src}", "device=cpu", "batch_size=3", "decode=beam"]
    outputs = {}
    for n in (1, 3):
        out = tmp_path / f"out{n}.txt"
        overrides = [*common, f"output={out}", f"decode.nbest={n}"]  # no + needed
        run(compose_config("translate", overrides, tmp_path / str(n)))
        outputs[n] = _read(out)
    entries = [line.split(" ||| ") for line in outputs[3]]
    blank = {i for i, line in enumerate(lines) if not line.strip()}
    assert len(entries) == 3 * (len(lines) - len(blank)) + len(blank)
    for i in range(len(lines)):
        mine = [e for e in entries if e[0] == str(i)]
        if i in blank:
            assert mine == [[str(i), "", "0.0000"]]
            continue
        scores = [float(e[2]) for e in mine]
        assert len(mine) == 3 and scores == sorted(scores, reverse=True) and scores[0] < 0
        assert mine[0][1] == outputs[1][i]  # the best of the 3 is the plain output (nbest=1)
        assert len({e[1] for e in mine}) == 3  # three different hypotheses


def test_an_ensemble_of_one_checkpoint_twice_translates_as_that_checkpoint(ckpt, lines, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    outputs = []
    for value in (str(ckpt), f"[{ckpt},{ckpt}]"):
        out = tmp_path / f"out{len(outputs)}.txt"
        overrides = [f"ckpt_path={value}", f"input={src}", f"output={out}", "device=cpu"]
        run(compose_config("translate", [*overrides, "decode=beam"], tmp_path / str(len(outputs))))
        outputs.append(_read(out))
    assert outputs[0] == outputs[1] and len(set(outputs[0])) > 2


def test_an_ensemble_needs_one_tokenizer(ckpt, tmp_path):
    other = tmp_path / "other.ckpt"
    checkpoint = torch.load(ckpt, weights_only=True)
    tokenizer = json.loads(checkpoint["tokenizers"]["joint"])
    tokenizer["normalizer"] = None  # another tokenizer with the same vocabulary size
    checkpoint["tokenizers"] = {"joint": json.dumps(tokenizer)}
    torch.save(checkpoint, other)
    overrides = [f"ckpt_path=[{ckpt},{other}]", "device=cpu", "input=-"]
    with pytest.raises(CheckpointError, match="another tokenizer"):
        run(compose_config("translate", overrides, tmp_path))


def test_decode_config_merges_and_names_bad_keys():
    base = DecodeConfig(strategy="beam", beam_size=4, length_penalty=0.6)
    assert decode_config(base, {"beam_size": 8}) == DecodeConfig("beam", 8, 0.6)
    with pytest.raises(ConfigError, match="beam_width"):
        decode_config(base, {"beam_width": 8})
    with pytest.raises(ConfigError, match="nbest"):
        decode_config(base, {"nbest": 9})


def test_long_line_truncated_with_warning(translator, sources, caplog):
    with caplog.at_level(logging.WARNING, logger="aiayn.inference.translator"):
        got = translator.translate([sources[0], LONG], source="doc.txt")
    assert "doc.txt:2" in caplog.text and "truncated" in caplog.text
    ids = translator.tokenizers.encode([LONG], side="src")[0][: translator.max_src_tokens]
    hyp = generate(translator.model, collate_sources([ids])[0], translator.decode)[0][0]
    assert got == [
        reference_translations(translator, [sources[0]])[0],
        translator.tokenizers.decode([hyp.tokens], side="tgt")[0],
    ]


def test_long_line_fails_naming_it_and_keeps_earlier_output(ckpt, translator, sources, tmp_path):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join([sources[0], sources[1], sources[2], LONG, sources[3]]) + "\n")
    overrides = [f"ckpt_path={ckpt}", f"input={src}", f"output={out}", "batch_size=2"]
    cfg = compose_config("translate", [*overrides, "on_long=fail", "device=cpu"], tmp_path)
    with pytest.raises(TranslationError, match=rf"{src}:4: \d+ tokens.*on_long=truncate"):
        run(cfg)
    assert _read(out) == reference_translations(translator, sources[:3])


def test_missing_and_broken_checkpoints(tmp_path):
    with pytest.raises(CheckpointError, match=r"nope\.ckpt not found"):
        load_checkpoint(tmp_path / "nope.ckpt")
    broken = tmp_path / "broken.ckpt"
    broken.write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match=r"broken\.ckpt is not a checkpoint \(not the zip"):
        load_checkpoint(broken)


def test_mismatched_tokenizer(ckpt, tmp_path):
    import torch

    texts = ["a small corpus", "for a tokenizer", "of another size"] * 5
    other = Tokenizers(train_tokenizer(texts, TokenizerConfig(vocab_size=40, min_frequency=1)))
    other.save(tmp_path)
    given = str(tmp_path / "tokenizer.json")
    with pytest.raises(CheckpointError, match=r"differs from the one checkpoint .* was trained"):
        load_checkpoint(ckpt, "cpu", tokenizer=given)
    bare = tmp_path / "bare.ckpt"  # a checkpoint without its tokenizer: sizes must still fit
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    del checkpoint["tokenizers"]
    torch.save(checkpoint, bare)
    with pytest.raises(CheckpointError, match=r"vocabulary of \d+ tokens but the model expects"):
        load_checkpoint(bare, "cpu", tokenizer=given)


def test_invalid_utf8_line_is_named_and_earlier_lines_are_kept(ckpt, translator, sources, tmp_path):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    good = "\n".join(sources[:2]).encode()
    src.write_bytes(good + b"\nbad \xff\xfe bytes\n" + sources[2].encode() + b"\n")
    overrides = [f"ckpt_path={ckpt}", f"input={src}", f"output={out}", "batch_size=5"]
    with pytest.raises(TranslationError, match=rf"{src}:3: not valid UTF-8"):
        run(compose_config("translate", [*overrides, "device=cpu"], tmp_path))
    assert _read(out) == reference_translations(translator, sources[:2])


def test_input_and_output_the_same_file_is_refused(ckpt, sources, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text(sources[0] + "\n")
    overrides = [f"ckpt_path={ckpt}", f"input={src}", f"output={src}", "device=cpu"]
    with pytest.raises(OutputError, match="same file"):
        run(compose_config("translate", overrides, tmp_path))
    assert src.read_text() == sources[0] + "\n"
    linked = tmp_path / "hardlink.txt"  # another name for the same file
    linked.hardlink_to(src)
    overrides = [f"ckpt_path={ckpt}", f"input={src}", f"output={linked}", "device=cpu"]
    with pytest.raises(OutputError, match="same file"):
        run(compose_config("translate", overrides, tmp_path))
    assert src.read_text() == sources[0] + "\n"


def test_required_and_unknown_keys(tmp_path):
    with pytest.raises(ConfigError, match="ckpt_path"):
        run(compose_config("translate", [], tmp_path))
    with pytest.raises(ConfigError, match="on_long"):
        run(compose_config("translate", ["ckpt_path=x.ckpt", "on_long=skip"], tmp_path))
    with pytest.raises(CONFIG_ERRORS, match="beam_sise"):
        run(compose_config("translate", ["ckpt_path=x.ckpt", "+beam_sise=3"], tmp_path))


@pytest.mark.slow
def test_prefixes_force_the_start_of_each_output(ckpt, translator, lines, tmp_path):
    """decode.prefix (every line) and prefix_file (one per line; blank forces nothing), with
    greedy and beam n-best: each output starts with its prefix, which is not where the plain
    output starts; a prefix equal to the plain output's first word changes nothing."""
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    plain = reference_translations(translator, lines)
    firsts = [t.split()[0] for t in plain if t]
    rotated = iter(firsts[1:] + firsts[:1])  # another line's first word
    forced = [next(rotated) if line.strip() else "" for line in lines]
    forced[-1] = plain[-1].split()[0]  # its own first word
    assert sum(not p.startswith(f) for p, f in zip(plain, forced, strict=True) if f) >= 2
    prefix_file = tmp_path / "prefixes.txt"
    prefix_file.write_text("\n".join(forced) + "\n", encoding="utf-8")
    base = [f"ckpt_path={ckpt}", f"input={src}", "device=cpu", "batch_size=3"]
    for extra in ([], ["decode=beam", "+decode.nbest=2"]):
        out = tmp_path / f"out{len(extra)}.txt"
        overrides = [*base, f"output={out}", f"prefix_file={prefix_file}", *extra]
        run(compose_config("translate", overrides, tmp_path / f"p{len(extra)}"))
        got = _read(out)
        if extra:  # n-best entries: <line> ||| <text> ||| <score>
            got = [e.split(" ||| ") for e in got]
            assert all(e[1].startswith(forced[int(e[0])]) for e in got)
            continue
        assert all(g.startswith(f) for g, f in zip(got, forced, strict=True))
        assert got[-1] == plain[-1]
        assert got[1] == "" and got[3] == ""
    out = tmp_path / "same.txt"
    word = firsts[1]
    overrides = [*base, f"output={out}", f"+decode.prefix='{word}'"]
    run(compose_config("translate", overrides, tmp_path / "same"))
    got = _read(out)
    assert all(g.startswith(word) for g, line in zip(got, lines, strict=True) if line.strip())


def test_a_prefix_file_must_match_the_input_line_for_line(ckpt, lines, tmp_path):
    src, out, prefixes = tmp_path / "in.txt", tmp_path / "out.txt", tmp_path / "p.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prefixes.write_text("a\nb\n", encoding="utf-8")
    overrides = [f"ckpt_path={ckpt}", f"input={src}", f"output={out}", "device=cpu"]
    overrides += ["batch_size=1", f"prefix_file={prefixes}"]
    with pytest.raises(TranslationError, match=rf"{prefixes} has 2 lines, {src} more"):
        run(compose_config("translate", overrides, tmp_path))
    assert len(_read(out)) == 2  # the lines that had a prefix were translated and kept
    prefixes.write_text("\n".join(["x"] * (len(lines) + 1)) + "\n", encoding="utf-8")
    with pytest.raises(TranslationError, match=f"{prefixes} has more lines than the {len(lines)}"):
        run(compose_config("translate", overrides, tmp_path))
    assert len(_read(out)) == len(lines)
    missing = [o for o in overrides if not o.startswith("prefix_file")]
    with pytest.raises(TranslationError, match=r"prefix_file .*nope\.txt not found"):
        run(compose_config("translate", [*missing, f"prefix_file={tmp_path}/nope.txt"], tmp_path))


@pytest.mark.slow
def test_translate_and_evaluate_show_progress_on_a_terminal(ckpt, lines, tmp_path, terminal):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    overrides = [f"ckpt_path={ckpt}", f"input={src}", f"output={out}", "device=cpu"]
    run(compose_config("translate", [*overrides, "batch_size=2"], tmp_path / "t"))
    n = len(lines)
    assert "translate in.txt" in terminal() and f"{n}/{n}" in terminal()
    before = terminal()
    run(compose_config("translate", [*overrides, "progress=false"], tmp_path / "q"))
    assert terminal() == before  # progress=false draws nothing

    from aiayn.inference.evaluation import run as evaluate

    for mode in ("translate", "score"):
        evaluate(
            compose_config(
                "eval", [f"ckpt_path={ckpt}", "device=cpu", f"mode={mode}"], tmp_path / mode
            )
        )
        assert f"{mode} test" in terminal()


def test_translating_onto_a_full_device_is_one_storage_error(ckpt, tmp_path):
    """/dev/full: every write fails with ENOSPC, as on a full disk; one line that names the
    device as refusing (no free-space figure of /dev's file system); the input is untouched."""
    from aiayn.errors import StorageError

    if not Path("/dev/full").exists():
        pytest.skip("needs Linux's /dev/full")
    src = tmp_path / "in.txt"
    src.write_text("one two\nthree\n", encoding="utf-8")
    overrides = [f"ckpt_path={ckpt}", f"input={src}", "output=/dev/full", "device=cpu"]
    with pytest.raises(StorageError, match=r"^/dev/full refused the write \(no space on that"):
        run(compose_config("translate", overrides, tmp_path))
    assert src.read_text(encoding="utf-8") == "one two\nthree\n"


@pytest.mark.parametrize("path", ["translate_all", "translate.py"])
def test_a_corpus_packs_the_weights_once_for_all_its_batches(
    path, ckpt, translator, lines, tmp_path, monkeypatch
):
    """evaluate.py (`translate_all`) and translate.py hold the MKL-packed weights over all
    their batches (`Translator.decoding`), instead of packing them again for each batch; the
    translations are those of `translate_batch`, which does not pack."""
    from aiayn.kernels import linear

    monkeypatch.setattr(linear, "PACKING", True)  # whatever this CPU's default
    packs: list[int] = []
    pack = linear.pack
    monkeypatch.setattr(linear, "pack", lambda weight: packs.append(1) or pack(weight))
    batches = -(-sum(bool(line.strip()) for line in lines) // 2)
    assert batches >= 3
    if path == "translate_all":
        got = translator.translate_all(lines, batch_size=2)
    else:
        src, out = tmp_path / "in.txt", tmp_path / "out.txt"
        src.write_text("\n".join(lines) + "\n", encoding="utf-8")
        overrides = [f"ckpt_path={ckpt}", f"input={src}", f"output={out}", *CPU]
        assert run(compose_config("translate", overrides, tmp_path)) == len(lines)
        got = _read(out)
    layers = sum(isinstance(m, linear.PackableMixin) for m in translator.model.modules())
    assert len(packs) == layers  # once, not once per batch
    assert got == reference_translations(translator, lines)
    assert len(packs) == layers


def test_dtype_puts_the_weights_in_it_and_auto_picks_by_device(ckpt, lines, tmp_path, monkeypatch):
    """dtype=bfloat16 decodes with bf16 weights (scores summed in float32) into the same
    number of aligned lines; auto is float32 on the CPU and bf16 / fp16 by the GPU's compute
    capability; an unknown name is refused by key."""
    from aiayn.inference.checkpoint import resolve_dtype

    half = load_checkpoint(ckpt, "cpu", dtype="bfloat16")
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16}
    out = tmp_path / "out.txt"
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    overrides = [f"ckpt_path={ckpt}", f"input={src}", f"output={out}", "dtype=bfloat16"]
    assert run(compose_config("translate", [*overrides, "device=cpu"], tmp_path)) == len(lines)
    got = _read(out)
    assert got[1] == "" and got[3] == "" and all(got[i] for i in (0, 2, 4, 5))
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    for capability, dtype in (((8, 0), torch.bfloat16), ((7, 0), torch.float16)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, c=capability: c)
        assert resolve_dtype("auto", torch.device("cuda")) == dtype
    with pytest.raises(ConfigError, match="dtype must be auto or one of"):
        resolve_dtype("half", torch.device("cpu"))
