"""The peer table: one row per system, setting and checkpoint scored, over its runs'
result.json files (benchmarks/peers/result.py), as markdown.

    python benchmarks/peers/table.py experiments/peers/*/result.json

A row's figures are the mean of its runs, with their range in brackets where there are
several. Columns: framework and version, setting, the checkpoint decoded (`averaged`: the last
5 an epoch apart; `last`), runs, updates, target tokens/s over the whole training command (the
one clock) and as the framework logs it, peak RSS of training, the length setting chosen on
val, val and test2016 tokenized BLEU, aiayn's test2016 BLEU from its last checkpoint too, wall
clock by stage (minutes; decoding a checkpoint counts in its own row), and the machines' fp32
matmul peaks measured with the runs. Runs with glibc's malloc as it comes
(`PEER_MALLOC=default`) make rows of their own, their setting saying so, and so do runs on
another kind of machine (their CPU's SIMD flags, `benchmarks/machine.py`): a row never
averages two kinds, told apart by its fp32 column. So do runs whose `layers` say how their
model differed from what the harness runs now (eole's and OpenNMT-py's setting 1 before
their attention and FFN biases were turned on), the setting naming it. A smoke-test result
(SMOKE=1) is refused: it checks a script, not a number.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

SAME = "same model and recipe"  # setting 1; every other setting names a peer's own recipe
# stage -> the stages.tsv names it sums (scoring a checkpoint adds `<name>.<checkpoint>`)
STAGES = {
    "text": ("text",),
    "prepare": ("prepare",),
    "train": ("train",),
    "average": ("average",),
    "α on val": ("choose_alpha_on_val",),
    "test": ("test",),
}
HEADER = (
    "| framework | setting | checkpoint | runs | updates | target tok/s, whole command "
    "| target tok/s, as logged | peak RSS (MiB) | α | val BLEU | test2016 BLEU "
    f"| minutes: {' / '.join(STAGES)} | fp32 GFLOP/s |"
)


def checkpoint(result: dict) -> str:
    """The weights a result scored: named since the harness averaged every system; before,
    aiayn decoded its average and each peer its last checkpoint."""
    return result.get("checkpoint") or ("averaged" if result["framework"] == "aiayn" else "last")


def cell(values: list[float | None], form: Callable[[float], str]) -> str:
    """The mean of the values given, with their range where they differ; – if none is."""
    known = [v for v in values if v is not None]
    if not known:
        return "–"
    text, low, high = form(statistics.fmean(known)), form(min(known)), form(max(known))
    return text if low == high else f"{text} ({low}–{high})"


def stage_seconds(result: dict, stage: str) -> float | None:
    """Seconds of `stage` in one result's row: a stage done per checkpoint
    (`choose_alpha_on_val.last`) counts in that checkpoint's row only."""
    found = []
    for name, seconds in result["stages_s"].items():
        stage_name, _, scored = name.partition(".")
        if stage_name in STAGES[stage] and scored in ("", checkpoint(result)):
            found.append(seconds)
    return sum(found) if found else None


def row(results: list[dict]) -> str:
    first = results[0]

    def values(key: str) -> list:
        return [r.get(key) for r in results]

    minutes = " / ".join(
        cell([stage_seconds(r, s) for r in results], lambda m: f"{m / 60:.1f}") for s in STAGES
    )
    versions = sorted({r["version"] or "" for r in results})
    cells = (
        f"{first['framework']} {', '.join(versions)}".strip(),
        ", ".join(
            [first["setting"]]
            + (["PEER_MALLOC=default"] if first.get("malloc") == "default" else [])
            + ([first["layers"]] if first.get("layers") else [])
        ),
        checkpoint(first),
        str(len(results)),
        cell(values("updates"), lambda v: f"{v:,.0f}"),
        cell(values("target_tokens_per_sec_whole"), lambda v: f"{v:,.0f}"),
        cell(values("target_tokens_per_sec"), lambda v: f"{v:,.0f}"),
        cell(values("peak_rss_mib"), lambda v: f"{v:,.0f}"),
        cell(values("alpha"), lambda v: f"{v:g}"),
        cell(values("val_bleu_tok"), lambda v: f"{v:.2f}"),
        cell(values("test_bleu_tok"), lambda v: f"{v:.2f}"),
        minutes,
        cell([r.get("machine", {}).get("fp32_gflops") for r in results], lambda v: f"{v:.1f}"),
    )
    return "| " + " | ".join(cells) + " |"


def rows(results: list[dict]) -> list[list[dict]]:
    """Results grouped by system, setting, allocator setting, machine kind, layers and
    checkpoint (a result scoring several checkpoints joins a group for each); setting 1 first,
    then the best mean test BLEU."""
    groups: dict[tuple[str, str, str | None, str | None, str | None, str], list[dict]] = {}
    for result in results:
        for name, scored in (result.get("scores") or {checkpoint(result): {}}).items():
            one = {**result, **scored, "checkpoint": name}
            kind = one.get("machine", {}).get("flags")
            key = (
                one["framework"],
                one["setting"],
                one.get("malloc"),
                kind,
                one.get("layers"),
                name,
            )
            groups.setdefault(key, []).append(one)
    return sorted(
        groups.values(),
        key=lambda g: (g[0]["setting"] != SAME, -statistics.fmean(r["test_bleu_tok"] for r in g)),
    )


def table(paths: list[Path]) -> str:
    results = [json.loads(path.read_text()) for path in paths]
    for path, result in zip(paths, results, strict=True):
        if result["smoke_test"]:
            raise SystemExit(f"{path}: a SMOKE=1 result checks the script, not a number")
    rule = "|" + "---|" * 3 + "---:|" * 8 + "---|---:|"
    return "\n".join([HEADER, rule, *map(row, rows(results))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", type=Path, nargs="+")
    print(table(parser.parse_args().results))


if __name__ == "__main__":
    main()
