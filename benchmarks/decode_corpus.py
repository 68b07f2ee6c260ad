"""Decoding a real test set: a trained checkpoint translates a whole split the way `evaluate.py`
does (`Translator.translate_all`: batches of `--batch-size` sentences sorted by length), greedy
and beam (the checkpoint's beam, α and length limits), with aiayn's PyTorch decoder and the
CTranslate2 conversion (float32, int8). Prints the machine, then per engine and strategy the
seconds of the whole split (best of `--repeats` after a warm-up batch), sentences/s and
sacreBLEU against the references (lowercased where the model's vocabulary is).

    python benchmarks/decode_corpus.py --ckpt <run>/checkpoints/averaged.ckpt [--split test]
        [--engines torch,ctranslate2-float32,ctranslate2-int8] [--batch-size 64]
        [--repeats 2] [--threads 2] [--hypotheses DIR]

Unlike `decode_speed.py` (random weights, every sentence forced to the same length), the
sentences here end where the model ends them, so this is where decoding a batch whose
sentences finish at different steps is measured. The engines run one after another in this
process, PyTorch first (a CTranslate2 translator that has run slows torch's products in the
same process). To compare two versions of aiayn, run this script under each
(`PYTHONPATH=<other checkout>/src`: it uses only `load_translator`, `read_split` and
`translate_all`); `--hypotheses DIR` writes each row's translations to
`DIR/<engine>.<strategy>.txt`, so that two versions' outputs can be compared with `diff`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import aiayn
from aiayn.data import read_split
from aiayn.inference.ct2 import load_translator
from aiayn.inference.evaluation import run_data_config, score

sys.path.insert(0, str(Path(__file__).parent))
from machine import describe

ENGINES = ("torch", "ctranslate2-float32", "ctranslate2-int8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hypotheses", type=Path, default=None)
    args = parser.parse_args()
    engines = args.engines.split(",")
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        parser.error(f"--engines: {unknown[0]!r} is not one of {', '.join(ENGINES)}")
    torch.set_num_threads(args.threads)
    info = describe()
    print(f"machine: {info['cpu']}, {args.threads} threads, flags {info['flags']}")
    print(f"fp32 GEMM peak {info['fp32_gflops']} GFLOP/s; torch {torch.__version__}")
    print(f"aiayn from {Path(aiayn.__file__).parent}")
    data = run_data_config(args.ckpt)
    sources, references = read_split(data, args.split)
    print(f"{args.ckpt}: {data.source} {args.split}, {len(sources)} sentences")
    print("| engine | strategy | seconds | sent/s | BLEU |")
    print("|---|---|---:|---:|---:|")
    for name in engines:
        engine, _, compute_type = name.partition("-")
        translator = load_translator(
            args.ckpt, "cpu", engine=engine, ct2_compute_type=compute_type or "default"
        )
        if translator.tokenizers.lowercases("tgt"):
            references = [r.lower() for r in references]
        for strategy in ("greedy", "beam"):
            settled = translator.with_settings({"strategy": strategy})
            settled.translate_all(sources[: args.batch_size], args.batch_size)  # warm-up
            best = float("inf")
            for _ in range(args.repeats):
                start = time.perf_counter()
                hypotheses = settled.translate_all(sources, args.batch_size)
                best = min(best, time.perf_counter() - start)
            label = strategy if strategy == "greedy" else f"beam {settled.decode.beam_size}"
            bleu = score(hypotheses, references)["bleu"]
            if args.hypotheses is not None:
                args.hypotheses.mkdir(parents=True, exist_ok=True)
                text = "".join(f"{line}\n" for line in hypotheses)
                (args.hypotheses / f"{name}.{strategy}.txt").write_text(text, encoding="utf-8")
            rate = len(sources) / best
            print(f"| {name} | {label} | {best:.3f} | {rate:.1f} | {bleu:.2f} |", flush=True)
        del translator


if __name__ == "__main__":
    main()
