"""Score a checkpoint on a split: translate the raw sources, write the hypotheses, and
sacreBLEU BLEU + chrF with their signatures in `bleu.json`.

`python evaluate.py ckpt_path=... [data=multi30k split=test decode=beam]` (conf/eval.yaml)
calls `run`. Sources are read as text (the corpus's `Source.read`) and tokenized with the
checkpoint's tokenizer (not the data cache's), so any checkpoint scores on any corpus without
preparing a cache. `data` unset means: the data config of the run that wrote the checkpoint
(`<run>/.hydra/config.yaml`, beside `checkpoints/`).

`tok_bleu: true` adds `bleu_tok`: BLEU on lowercased, Moses-normalised and Moses-tokenised
hypotheses and references (sacremoses, target language; sacreBLEU with tokenize='none'), the
way fairseq-based papers score Multi30k: it reproduces the upstream `tok/*.lc.norm.tok.*`
references exactly.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from sacrebleu.metrics import BLEU, CHRF
from sacremoses import MosesPunctNormalizer, MosesTokenizer

from aiayn.console import progress
from aiayn.data.config import DataConfig
from aiayn.data.sources import get_source, local_files
from aiayn.errors import ConfigError, DataError, writing
from aiayn.inference.checkpoint import run_data_config
from aiayn.inference.config import EvalConfig
from aiayn.inference.ct2 import load_translator
from aiayn.inference.scoring import score_pairs
from aiayn.inference.translator import Translator
from aiayn.outputs import check_output
from aiayn.schema import to_schema

log = logging.getLogger(__name__)


def _score_references(
    config: EvalConfig, translator: Translator, sources: list[str], references: list[str]
) -> dict[str, Any]:
    """mode=score: `scores.<split>.tsv` (per pair: tokens, NLL, NLL per token, PPL) and
    `score.json` (the corpus NLL per token and PPL)."""
    if not any(reference.strip() for reference in references):
        raise DataError(
            f"mode=score: every reference of split {config.split!r} is empty, so there is "
            "nothing to score; check the data settings (data.root, the split's files)"
        )
    with progress(config.progress) as bars:
        advance = bars.stage(f"score {config.split}", total=len(sources))
        scored = score_pairs(translator, sources, references, config.batch_size, advance)
    output_dir = Path(config.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    table = output_dir / f"scores.{config.split}.tsv"
    lines = ["line\ttokens\tnll\tnll_per_token\tppl"]
    for line, (tokens, nll) in enumerate(scored, start=1):
        lines.append(
            f"{line}\t{tokens}\t{nll:.4f}\t{nll / tokens:.4f}\t{math.exp(nll / tokens):.3f}"
        )
    table.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tokens, nll = sum(t for t, _ in scored), sum(n for _, n in scored)
    result = {
        "split": config.split,
        "num_sentences": len(scored),
        "tokens": tokens,
        "nll_per_token": nll / tokens,
        "ppl": math.exp(nll / tokens),
        "checkpoint": _resolved(config.ckpt_path),
        "scores": str(table),
    }
    (output_dir / "score.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(
        f"{config.split}: NLL {result['nll_per_token']:.4f} nats per token, PPL {result['ppl']:.3f}"
    )
    log.info("wrote %s and %s", table, output_dir / "score.json")
    return result


def _resolved(ckpt_path: str | list[str] | None) -> str | list[str] | None:
    if isinstance(ckpt_path, (list, tuple)):
        return [str(Path(p).resolve()) for p in ckpt_path]
    return str(Path(ckpt_path).resolve()) if ckpt_path else None


def _data_of(ckpt_path: str | list[str] | None, translator: Translator) -> DataConfig:
    """The run's data config: beside the (first) checkpoint, or stored in a CTranslate2
    export."""
    if isinstance(ckpt_path, (list, tuple)):
        ckpt_path = ckpt_path[0]
    if ckpt_path:
        return run_data_config(ckpt_path)
    stored = getattr(translator, "metadata", {}).get("data")
    if stored is None:
        raise ConfigError(
            "data is not set and the export carries no run data config: choose the corpus, "
            "e.g. data=multi30k"
        )
    return to_schema(stored, DataConfig)


def moses_tokenize(lines: list[str], lang: str) -> list[str]:
    """Lowercase, normalise punctuation and tokenise with Moses rules (as `*.lc.norm.tok.*`)."""
    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [
        tokenizer.tokenize(normalizer.normalize(line.lower()), escape=True, return_str=True)
        for line in lines
    ]


def score(
    hypotheses: list[str], references: list[str], tok_lang: str | None = None
) -> dict[str, Any]:
    """sacreBLEU BLEU and chrF with their signatures; with `tok_lang` also `bleu_tok`, BLEU on
    Moses-tokenised lowercased text of that language."""
    scored = {"bleu": (BLEU(), hypotheses, references), "chrf": (CHRF(), hypotheses, references)}
    if tok_lang:
        tokenized = (moses_tokenize(hypotheses, tok_lang), moses_tokenize(references, tok_lang))
        scored["bleu_tok"] = (BLEU(tokenize="none", force=True), *tokenized)
    result: dict[str, Any] = {}
    for name, (metric, hyps, refs) in scored.items():
        value = metric.corpus_score(hyps, [refs])
        signature = metric.get_signature()
        if name == "bleu_tok":  # say what was done before sacreBLEU saw the text
            signature = f"{signature}+moses.lc.norm.tok.{tok_lang}"
        result[name] = value.score
        result[f"{name}_signature"] = str(signature)
        result[f"{name}_verbose"] = f"{value} {signature}"
    return result


def run(cfg: DictConfig | dict) -> dict[str, Any]:
    """What `python evaluate.py` does; returns what it writes to `<output_dir>/bleu.json`."""
    config = to_schema(cfg, EvalConfig)
    inputs = {"ckpt_path": config.ckpt_path, "a file of ct2_path": config.ct2_path}
    written = (f"hypotheses.{config.split}.txt", "bleu.json")
    if config.mode == "score":
        written = (f"scores.{config.split}.tsv", "score.json")
    for name in written:
        check_output(Path(config.paths.output_dir) / name, "paths.output_dir's", inputs)
    translator = load_translator(
        config.ckpt_path,
        config.device,
        engine=config.engine,
        ct2_path=config.ct2_path,
        ct2_compute_type=config.ct2_compute_type,
        ct2_inter_threads=config.ct2_inter_threads,
        ct2_intra_threads=config.ct2_intra_threads,
        dtype=config.dtype,
    )
    translator = translator.with_settings(config.decode.given(), config.on_long)
    data = config.data or _data_of(config.ckpt_path, translator)
    corpus = get_source(data)  # one source: its files are found (and checked) once
    for name in written:  # the corpus is known now: the references are inputs too
        output = Path(config.paths.output_dir) / name
        check_output(output, "paths.output_dir's", {"a file of the corpus": local_files(corpus)})
    sources, references = corpus.read(config.split)
    if config.mode == "score":
        with writing(config.paths.output_dir):
            return _score_references(config, translator, sources, references)
    lowercased = translator.tokenizers.lowercases("tgt")
    if lowercased:  # the model cannot produce capitals: score as training's val/test BLEU
        references = [r.lower() for r in references]
    source = f"{data.source}:{config.split} source"
    with progress(config.progress) as bars:
        advance = bars.stage(f"translate {config.split}", total=len(sources))
        hypotheses = translator.translate_all(sources, config.batch_size, source, advance)

    output_dir = Path(config.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    hyp_path = output_dir / f"hypotheses.{config.split}.txt"
    text = "".join(f"{h}\n" for h in hypotheses)
    with writing(hyp_path, len(text.encode())):
        hyp_path.write_text(text, encoding="utf-8")
    result = {
        **score(hypotheses, references, data.tgt_lang if config.tok_bleu else None),
        "split": config.split,
        "references_lowercased": lowercased,
        "num_sentences": len(hypotheses),
        "checkpoint": _resolved(config.ckpt_path),
        "export": _resolved(config.ct2_path),
        "engine": config.engine,
        "hypotheses": str(hyp_path),
        "decode": asdict(translator.decode),
    }
    with writing(output_dir / "bleu.json"):
        (output_dir / "bleu.json").write_text(json.dumps(result, indent=2) + "\n", "utf-8")
    for name in ("bleu", "chrf", "bleu_tok"):
        if name in result:
            print(result[f"{name}_verbose"])
    log.info("wrote %s and %s", hyp_path, output_dir / "bleu.json")
    return result
