"""evaluate.py: hypotheses in corpus order (as translate_batch gives them on the data
pipeline's batches), bleu.json with sacreBLEU scores equal to scoring the written file, their
signatures, the run's own data config by default, clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU, CHRF

from aiayn.data import read_split
from aiayn.data.datamodule import TranslationDataModule
from aiayn.errors import ConfigError
from aiayn.inference.evaluation import moses_tokenize, run, run_data_config, score
from tests.helpers import CONFIG_ERRORS, cli, compose_config


@pytest.fixture(scope="module")
def evaluated(ckpt, data_overrides, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    overrides = [f"ckpt_path={ckpt}", *data_overrides, "tok_bleu=true", "device=cpu"]
    return out, run(compose_config("eval", overrides, out))


def test_bleu_json_matches_sacrebleu_on_written_file(evaluated, ckpt):
    out, result = evaluated
    hyps = (out / "hypotheses.test.txt").read_text(encoding="utf-8").split("\n")[:-1]
    refs = read_split(run_data_config(ckpt), "test")[1]
    saved = json.loads((out / "bleu.json").read_text())
    assert saved == result
    assert len(hyps) == len(refs) == saved["num_sentences"] == 30
    assert saved["bleu"] == pytest.approx(BLEU().corpus_score(hyps, [refs]).score, abs=1e-9)
    assert saved["chrf"] == pytest.approx(CHRF().corpus_score(hyps, [refs]).score, abs=1e-9)
    tok = BLEU(tokenize="none").corpus_score(
        moses_tokenize(hyps, "de"), [moses_tokenize(refs, "de")]
    )
    assert saved["bleu_tok"] == pytest.approx(tok.score, abs=1e-9)
    assert saved["chrf"] > 0
    assert saved["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|")
    assert saved["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|")
    assert saved["bleu_tok_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:none|")
    assert saved["bleu_tok_signature"].endswith("+moses.lc.norm.tok.de")
    assert saved["split"] == "test" and saved["decode"]["strategy"] == "greedy"


def test_hypotheses_equal_translate_batch_on_data_batches(evaluated, translator, ckpt):
    out, _ = evaluated
    hyps = (out / "hypotheses.test.txt").read_text(encoding="utf-8").split("\n")[:-1]
    datamodule = TranslationDataModule(run_data_config(ckpt))
    datamodule.prepare_data()
    datamodule.setup("test")
    expected: dict[int, str] = {}
    for batch in datamodule.dataloader("test"):
        expected.update(zip(batch.ids.tolist(), translator.translate_batch(batch.src), strict=True))
    assert hyps == [expected[i] for i in range(len(hyps))]
    assert len(set(hyps)) > 3


def test_data_defaults_to_the_runs_config(evaluated, ckpt, tmp_path):
    _, first = evaluated
    result = run(compose_config("eval", [f"ckpt_path={ckpt}", "device=cpu"], tmp_path))
    assert result["bleu"] == first["bleu"] and result["chrf"] == first["chrf"]
    alone = tmp_path / "alone.ckpt"
    shutil.copy(ckpt, alone)
    with pytest.raises(ConfigError, match="data=multi30k"):
        run_data_config(alone)


def test_score_perfect_and_partial():
    refs = ["the cat sat on the mat .", "a dog runs in the park ."]
    assert score(refs, refs)["bleu"] == pytest.approx(100.0)
    hyps = ["the cat sat on a mat .", "a dog runs ."]
    assert score(hyps, refs)["bleu"] == pytest.approx(BLEU().corpus_score(hyps, [refs]).score)


def test_cli_missing_checkpoint_and_unknown_key(tmp_path):
    args = [f"ckpt_path={tmp_path / 'missing.ckpt'}", "data=toy", f"paths.log_dir={tmp_path}"]
    proc = cli(args, tmp_path, "evaluate.py")
    assert proc.returncode == 1
    assert "missing.ckpt not found" in proc.stderr and "Traceback" not in proc.stderr
    with pytest.raises(CONFIG_ERRORS, match="splitt"):
        run(compose_config("eval", ["ckpt_path=x.ckpt", "+splitt=val"], tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("edit", ["data.test_split=val", "+data.max_len=64"])
def test_cli_editing_the_runs_data_without_choosing_data_is_named(edit, tmp_path):
    args = [f"ckpt_path={tmp_path / 'missing.ckpt'}", edit, f"paths.log_dir={tmp_path}"]
    proc = cli(args, tmp_path, "evaluate.py")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"error: {edit}: no data config is chosen" in proc.stderr
    assert "split=val|test" in proc.stderr and "data=<option>" in proc.stderr
    args[1] = edit.lstrip("+")  # with data=<option>, the edit goes through
    chosen = cli([*args, "data=toy"], tmp_path, "evaluate.py")
    assert chosen.returncode == 1 and "missing.ckpt not found" in chosen.stderr


@pytest.mark.parametrize("lang", ["en", "de"])
def test_moses_tokenize_reproduces_the_published_tokenized_multi30k(multi30k_root, lang):
    raw = (multi30k_root / f"test2016.{lang}").read_text(encoding="utf-8").splitlines()
    tok = multi30k_root / "tok" / f"test2016.lc.norm.tok.{lang}"
    assert moses_tokenize(raw, lang) == tok.read_text(encoding="utf-8").splitlines()


def test_score_mode_gives_each_references_nll(ckpt, translator, data_overrides, tmp_path):
    import math

    import torch

    from aiayn.data.dataset import collate

    overrides = [f"ckpt_path={ckpt}", "device=cpu", "mode=score", "batch_size=7"]
    result = run(compose_config("eval", [*overrides, *data_overrides], tmp_path))
    rows = [line.split("\t") for line in Path(result["scores"]).read_text().splitlines()]
    assert rows[0] == ["line", "tokens", "nll", "nll_per_token", "ppl"]
    sources, references = read_split(run_data_config(ckpt), "test")
    assert len(rows) - 1 == len(references) == result["num_sentences"]
    tokenizers = translator.tokenizers
    for line in (1, len(references)):  # first and last, each alone through the model
        src = tokenizers.encode([sources[line - 1]], "src")[0]
        tgt = tokenizers.encode([references[line - 1]], "tgt")[0]
        batch = collate([(0, src, tgt)])
        with torch.no_grad():
            logprobs = translator.model(batch.src, batch.tgt_in).log_softmax(-1)
        nll = -logprobs[0].gather(-1, batch.tgt_out[0, :, None]).sum().item()
        tokens, total = int(rows[line][1]), float(rows[line][2])
        assert tokens == len(tgt) + 1 and total == pytest.approx(nll, abs=1e-3)
    tokens = sum(int(r[1]) for r in rows[1:])
    total = sum(float(r[2]) for r in rows[1:])
    assert result["nll_per_token"] == pytest.approx(total / tokens, rel=1e-4)
    assert result["ppl"] == pytest.approx(math.exp(total / tokens), rel=1e-4)
    assert json.loads((tmp_path / "score.json").read_text())["tokens"] == tokens


@pytest.mark.slow
def test_decode_corpus_benchmark_prints_rates_and_the_bleu_evaluate_gives(ckpt, tmp_path):
    """`benchmarks/decode_corpus.py` on the trained toy checkpoint: a row per engine and
    strategy whose rate is the split's sentences over its seconds, and whose BLEU is that of
    the hypotheses `translate_all` gives (as evaluate.py decodes)."""
    pytest.importorskip("ctranslate2")
    from aiayn.inference import load_checkpoint

    args = ["--ckpt", str(ckpt), "--engines", "torch,ctranslate2-int8", "--repeats", "1"]
    done = cli([*args, "--threads", "1"], tmp_path, module="benchmarks/decode_corpus.py")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in done.stdout.splitlines()
        if line.startswith(("| torch", "| ctranslate2"))
    ]
    assert [(r[0], r[1]) for r in rows] == [
        ("torch", "greedy"),
        ("torch", "beam 4"),
        ("ctranslate2-int8", "greedy"),
        ("ctranslate2-int8", "beam 4"),
    ]
    sources, references = read_split(run_data_config(ckpt), "test")
    for _, _, seconds, rate, _ in rows:  # seconds printed to the millisecond, rates to 0.1
        low, high = (len(sources) / (float(seconds) + d) for d in (0.0005, -0.0005))
        assert low - 0.05 <= float(rate) <= high + 0.05
    translator = load_checkpoint(ckpt, "cpu").with_settings({"strategy": "greedy"})
    expected = score(translator.translate_all(sources, 64), references)["bleu"]
    assert float(rows[0][4]) == pytest.approx(expected, abs=0.005)
