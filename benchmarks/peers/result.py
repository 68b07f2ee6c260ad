"""result.json of a peer run (benchmarks/peers/common.sh): stages, updates, target tokens
trained and target tokens/s two ways, peak RSS of training (`/usr/bin/time -v`), the chosen
length setting with val/test BLEU for each checkpoint scored (scores.tsv), the allocator
setting, the framework's version, this checkout's git SHA and the machine (CPU, flags, fp32
matmul peak measured after the run).

The two rates: `target_tokens_per_sec_whole` is the one clock for every system, target tokens
trained over the wall time of the whole training command (startup, data loading, validation
and saving included); `target_tokens_per_sec` is the framework's own figure as it logs it
(aiayn's and JoeyNMT's leave validation out, fairseq's, eole's and OpenNMT-py's windows take
in whatever falls within them)."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
from pathlib import Path

# (last update, target tokens per second) as each framework logs them; a third entry names
# the unit the framework logs its rate in where that is not target tokens
LOGS = {
    "eole": (r"Step (\d+)/", r"\d+/\s*(\d+) tok/s"),  # "<src>/<tgt> tok/s"
    "opennmt-py": (r"Step (\d+)/", r"\d+/\s*(\d+) tok/s"),
    # "| train | epoch 001 | ... | wps 1793.3 | ... | num_updates 20" (valid lines have a wps too)
    "fairseq": (r"num_updates[= ](\d+)", r"\| train \|[^\n]*?\bwps ([\d.]+)"),
    # "Epoch   3, Step:     1350, Batch Loss: ..., Tokens per Sec:     1234, Lr: ..." every 50
    # updates (target tokens, validation time left out), and "Interrupt at epoch 7, step
    # 3123." when run.sh stops it at the budget
    "joeynmt": (r"(?:Step:\s+|Interrupt at epoch \d+, step )(\d+)", r"Tokens per Sec:\s+(\d+)"),
    # "E=2 B=650\ts/sec=140.21 tok/sec=2710.50 u/sec=1.71\tppl=..." every 50 updates and
    # "Checkpoint [7]\tUpdates=700 Epoch=2 ..." at each checkpoint; its tok/sec counts padded
    # source tokens, so its sentences/s is taken (times the mean target length)
    "sockeye": (r"(?:\bB=|\tUpdates=)(\d+)", r"\bB=\d+\s+s/sec=([\d.]+)", "sentences"),
}
# target tokens in a batch as the framework logs them, averaged over the run: eole's and
# OpenNMT-py's "bsz: <src>/<tgt>/<sentences>", fairseq's words per batch of training lines
BATCH_TOKENS = {
    "eole": r"bsz:\s*\d+/(\d+)/",
    "opennmt-py": r"bsz:\s*\d+/(\d+)/",
    "fairseq": r"(?:train_inner \|[^\n]*?|\| train \|[^\n]*?)\bwpb[= ]([\d.]+)",
}


def target_tokens_per_sentence(work: Path) -> float:
    """Mean target tokens (pieces and EOS) of a training sentence, from `text.py export`'s
    text in `work`: what converts a rate in sentences into one in target tokens."""
    lines = (work / "text" / "train.bpe.de").read_text(encoding="utf-8").splitlines()
    return statistics.fmean(len(line.split(" ")) + 1 for line in lines)


def training(work: Path, framework: str) -> tuple[int | None, float | None, float | None]:
    """(updates, mean target tokens per second as logged, target tokens trained) of the run
    in `work`; None where the log does not tell."""
    if framework == "aiayn":  # its own record of the run: <work>/run/metrics.json
        metrics = json.loads((work / "run" / "metrics.json").read_text())
        tokens = metrics.get("train_target_tokens")
        return metrics.get("updates"), metrics.get("train_target_tokens_per_sec"), tokens
    log = (work / "train.log").read_text(errors="replace")
    step_pattern, rate_pattern, *unit = LOGS[framework]
    steps = [int(s) for s in re.findall(step_pattern, log)]
    rates = [float(r) for r in re.findall(rate_pattern, log)]
    rate = statistics.fmean(rates) if rates else None
    if rate is not None and unit == ["sentences"]:
        rate *= target_tokens_per_sentence(work)
    updates = max(steps) if steps else None
    return updates, rate, tokens_trained(work, framework, log, updates)


def tokens_trained(work: Path, framework: str, log: str, updates: int | None) -> float | None:
    """Target tokens the run trained on, from its log: updates x its mean target tokens a
    batch (eole, OpenNMT-py, fairseq); JoeyNMT's per-epoch token counts, its updates so far
    at each epoch's end read within one logging interval; Sockeye's sentences (`Samples=` at
    its last checkpoint) x the mean target length."""
    if not updates:
        return None
    if framework in BATCH_TOKENS:
        batches = [float(t) for t in re.findall(BATCH_TOKENS[framework], log)]
        return statistics.fmean(batches) * updates if batches else None
    if framework == "sockeye":
        samples = re.findall(r"\bSamples=(\d+)", log)
        return int(samples[-1]) * target_tokens_per_sentence(work) if samples else None
    epochs = re.findall(r"Epoch\s+\d+, total training loss.*?num\. of tokens: (\d+)", log)
    if not epochs:
        return None
    before_last_end = log[: log.rindex("total training loss")]
    steps = [int(s) for s in re.findall(r"Step:\s+(\d+)", before_last_end)]
    if not steps:
        return None
    return sum(int(t) for t in epochs) / max(steps) * updates


def scores(work: Path) -> dict[str, dict[str, float]]:
    """scores.tsv (common.sh): checkpoint -> its alpha, val and test BLEU, in the order run."""
    rows = (line.split("\t") for line in (work / "scores.tsv").read_text().splitlines())
    return {
        name: {"alpha": float(alpha), "val_bleu_tok": float(val), "test_bleu_tok": float(test)}
        for name, alpha, val, test in rows
    }


def machine(measure: bool) -> dict:
    """The CPU, its flags and measured fp32 peak (what benchmarks/machine.py prints), and this
    checkout's git SHA."""
    from aiayn.kernels.machine import cpu_flags, cpu_model, describe

    info = describe() if measure else {"cpu": cpu_model(), "flags": " ".join(cpu_flags())}
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True
    )
    return {**info, "aiayn_git_sha": sha.stdout.decode().strip()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("work", type=Path)
    for key in ("framework", "setting", "smoke"):
        parser.add_argument(f"--{key}", required=True)
    parser.add_argument("--version", default=None, help="the framework's version")
    parser.add_argument("--malloc", default=None, help="common.sh's PEER_MALLOC")
    parser.add_argument("--no-measure", action="store_true", help="skip the matmul peak")
    args = parser.parse_args()
    updates, rate, tokens = training(args.work, args.framework)
    rss = re.search(
        r"Maximum resident set size \(kbytes\): (\d+)", (args.work / "train.time").read_text()
    )
    stages = (args.work / "stages.tsv").read_text().splitlines()
    stages_s = {k: int(v) for k, v in (line.split("\t") for line in stages)}
    scored = scores(args.work)
    first = next(iter(scored.values()))  # the headline: the first checkpoint scored
    result = {
        "framework": args.framework,
        "setting": args.setting,
        "version": args.version,
        "smoke_test": args.smoke == "1",
        "updates": updates,
        "train_target_tokens": round(tokens) if tokens is not None else None,
        "target_tokens_per_sec_whole": (
            tokens / stages_s["train"] if tokens is not None and stages_s.get("train") else None
        ),
        "target_tokens_per_sec": rate,
        "peak_rss_mib": round(int(rss.group(1)) / 1024) if rss else None,
        "checkpoint": next(iter(scored)),
        **first,
        "scores": scored,
        "malloc": args.malloc,
        "stages_s": stages_s,
        "machine": machine(measure=not args.no_measure),
    }
    (args.work / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
