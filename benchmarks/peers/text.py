"""The same Multi30k text for every framework, and one scorer for all of them.

    python benchmarks/peers/text.py export --out <dir>    # <split>.bpe.{en,de}, vocab.txt
    python benchmarks/peers/text.py score --hyp <file> [--pieces] [--split test2016 | --ref <file>]

`export` prepares `experiment=multi30k_cpu`'s data (its shared, lowercased 8k BPE, trained
exactly as `python train.py experiment=multi30k_cpu` trains it) and writes each split as
space-separated subword pieces (`▁` marks a word start), plus the joint vocabulary in id
order: what a peer framework is given to train on, pre-tokenized.

`score` is the one scorer of the peer table: tokenized lowercased BLEU (Moses-normalised and
tokenised, sacreBLEU with tokenize=none: `aiayn.inference.evaluation.score`, what
`python evaluate.py tok_bleu=true` reports) of a hypothesis file against the split's
references; `--pieces` first joins a framework's subword output back into text.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
from pathlib import Path

from aiayn.data.tokenizer import JOINT_FILE

SPLITS = ("train", "val", "test2016")


def recipe_tokenizer():
    """The recipe's tokenizer and data config, from its data cache (prepared here if
    needed)."""
    from hydra import compose, initialize_config_dir
    from tokenizers import Tokenizer

    from aiayn.config import CONF_DIR, register, to_schema
    from aiayn.data.config import DataConfig
    from aiayn.data.prepare import prepare

    register()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        data = to_schema(compose("train", ["experiment=multi30k_cpu"]).data, DataConfig)
    return Tokenizer.from_file(str(prepare(data) / JOINT_FILE)), data


def root() -> Path:
    return Path(os.environ["MULTI30K_ROOT"])


def export(out: Path) -> None:
    tokenizer, data = recipe_tokenizer()
    out.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        for lang in (data.src_lang, data.tgt_lang):
            lines = (root() / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            # a tab inside a line (one in train.de) would make a piece the peers' tab-separated
            # vocabulary files cannot hold
            lines = [line.replace("\t", " ") for line in lines]
            pieces = [" ".join(e.tokens) for e in tokenizer.encode_batch(lines)]
            (out / f"{split}.bpe.{lang}").write_text("\n".join(pieces) + "\n", encoding="utf-8")
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    (out / "vocab.txt").write_text("".join(f"{piece}\n" for piece, _ in vocab), encoding="utf-8")
    print(f"{out}: {', '.join(SPLITS)} in {len(vocab)} pieces")


def join_pieces(line: str) -> str:
    """Subword pieces back into text (the Metaspace decoding of aiayn's tokenizer)."""
    return "".join(line.split()).replace("▁", " ").strip()


def read_hypotheses(hyp: Path, pieces: bool) -> list[str]:
    """A hypothesis file's lines as text: gunzipped (a recorded val hypothesis file is,
    experiments/peers), and its subword pieces joined where `pieces`."""
    raw = hyp.read_bytes()
    lines = (gzip.decompress(raw) if hyp.suffix == ".gz" else raw).decode().splitlines()
    return [join_pieces(line) for line in lines] if pieces else lines


def score(hyp: Path, ref: Path, lang: str, pieces: bool) -> dict:
    from aiayn.inference.evaluation import score as bleu

    hypotheses = read_hypotheses(hyp, pieces)
    references = ref.read_text(encoding="utf-8").splitlines()
    if len(hypotheses) != len(references):
        raise SystemExit(f"{hyp}: {len(hypotheses)} lines, {ref} has {len(references)}")
    result = bleu(hypotheses, references, lang)
    return {"bleu_tok": result["bleu_tok"], "signature": result["bleu_tok_signature"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    out = commands.add_parser("export")
    out.add_argument("--out", type=Path, required=True)
    scorer = commands.add_parser("score")
    scorer.add_argument("--hyp", type=Path, required=True)
    scorer.add_argument("--split", default="test2016", choices=SPLITS[1:])
    scorer.add_argument("--lang", default="de")
    scorer.add_argument("--ref", type=Path, help="default: $MULTI30K_ROOT/<split>.<lang>")
    scorer.add_argument("--pieces", action="store_true")
    args = parser.parse_args()
    if args.command == "export":
        export(args.out)
    else:
        ref = args.ref or root() / f"{args.split}.{args.lang}"
        print(json.dumps(score(args.hyp, ref, args.lang, args.pieces)))


if __name__ == "__main__":
    main()
