"""The peer table: one row per result.json (benchmarks/peers/result.py), as markdown.

    python benchmarks/peers/table.py experiments/peers/*/result.json

Columns: framework and version, setting, updates, target tokens/s (from the framework's own
log), peak RSS of training, the length setting chosen on val, val and test2016 tokenized
BLEU, wall clock by stage (minutes), and the machine's fp32 matmul peak measured with the
run. A smoke-test result (SMOKE=1) is refused: it checks a script, not a number.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SAME = "same model and recipe"  # setting 1; every other setting names a peer's own recipe
STAGES = ("text", "prepare", "train", "choose_alpha_on_val", "test")
HEADER = (
    "| framework | setting | updates | target tok/s | peak RSS (MiB) | α | val BLEU "
    "| test2016 BLEU | minutes: text / prepare / train / α on val / test | fp32 GFLOP/s |"
)


def row(result: dict) -> str:
    stages = result["stages_s"]
    minutes = " / ".join(f"{stages[s] / 60:.1f}" if s in stages else "–" for s in STAGES)
    rate = result["target_tokens_per_sec"]
    cells = (
        f"{result['framework']} {result['version'] or ''}".strip(),
        result["setting"],
        f"{result['updates']:,}" if result["updates"] is not None else "–",
        f"{rate:,.0f}" if rate is not None else "–",
        f"{result['peak_rss_mib']:,}" if result["peak_rss_mib"] is not None else "–",
        f"{result['alpha']:g}",
        f"{result['val_bleu_tok']:.2f}",
        f"{result['test_bleu_tok']:.2f}",
        minutes,
        str(result.get("machine", {}).get("fp32_gflops", "–")),
    )
    return "| " + " | ".join(cells) + " |"


def table(paths: list[Path]) -> str:
    results = [json.loads(path.read_text()) for path in paths]
    for path, result in zip(paths, results, strict=True):
        if result["smoke_test"]:
            raise SystemExit(f"{path}: a SMOKE=1 result checks the script, not a number")
    # setting 1 first, then each peer's own recipe (setting 2); best test BLEU first in each
    results.sort(key=lambda r: (r["setting"] != SAME, -r["test_bleu_tok"]))
    rule = "|" + "---|" * 2 + "---:|" * 6 + "---|---:|"
    return "\n".join([HEADER, rule, *map(row, results)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", type=Path, nargs="+")
    print(table(parser.parse_args().results))


if __name__ == "__main__":
    main()
