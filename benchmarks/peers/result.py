"""result.json of a peer run (benchmarks/peers/common.sh): stages, updates and target tokens/s
from the framework's own training log, peak RSS of training (`/usr/bin/time -v`), the chosen
length setting and val/test BLEU."""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

# (last update, target tokens per second) as each framework logs them
LOGS = {
    "eole": (r"Step (\d+)/", r"\d+/\s*(\d+) tok/s"),  # "<src>/<tgt> tok/s"
    "opennmt-py": (r"Step (\d+)/", r"\d+/\s*(\d+) tok/s"),
    # "| train | epoch 001 | ... | wps 1793.3 | ... | num_updates 20" (valid lines have a wps too)
    "fairseq": (r"num_updates (\d+)", r"\| train \|[^\n]*?\bwps ([\d.]+)"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("work", type=Path)
    for key in ("framework", "setting", "alpha", "val", "test", "smoke"):
        parser.add_argument(f"--{key}", required=True)
    args = parser.parse_args()
    log = (args.work / "train.log").read_text(errors="replace")
    step_pattern, rate_pattern = LOGS[args.framework]
    steps = [int(s) for s in re.findall(step_pattern, log)]
    rates = [float(r) for r in re.findall(rate_pattern, log)]
    rss = re.search(
        r"Maximum resident set size \(kbytes\): (\d+)", (args.work / "train.time").read_text()
    )
    stages = (args.work / "stages.tsv").read_text().splitlines()
    result = {
        "framework": args.framework,
        "setting": args.setting,
        "smoke_test": args.smoke == "1",
        "updates": max(steps) if steps else None,
        "target_tokens_per_sec": statistics.fmean(rates) if rates else None,
        "peak_rss_mib": round(int(rss.group(1)) / 1024) if rss else None,
        "alpha": float(args.alpha),
        "val_bleu_tok": float(args.val),
        "test_bleu_tok": float(args.test),
        "stages_s": {k: int(v) for k, v in (line.split("\t") for line in stages)},
    }
    (args.work / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
