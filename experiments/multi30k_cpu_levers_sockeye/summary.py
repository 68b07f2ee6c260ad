"""The levers' table from their records: python summary.py runs/*  (each a lever.sh output,
or its copy here). Greedy val BLEU at each validation comes from the run's metrics.csv; the
averaged checkpoint's beam-4 tokenized BLEU from scores.tsv (absent for a run stopped early), a
column for each length penalty any run tried."""

import csv
import sys
from pathlib import Path


def scores_of(d: Path) -> dict[tuple[str, str], float]:
    """(split, alpha) -> BLEU from a run's scores.tsv; empty if it was not scored."""
    if not (d / "scores.tsv").exists():
        return {}
    lines = (line.split("\t") for line in (d / "scores.tsv").read_text().splitlines())
    return {(split, alpha): float(bleu) for split, alpha, bleu in lines}


def main(dirs: list[str]) -> None:
    runs = [(d, scores_of(d)) for d in map(Path, dirs)]
    alphas = sorted({a for _, scores in runs for s, a in scores if s == "val"}, key=float)
    print(
        "name",
        "overrides",
        "updates",
        "greedy val, last",
        *(f"val a{a}" for a in alphas),
        "test2016 (a)",
        sep="\t",
    )
    for d, scores in runs:
        rows = list(csv.DictReader((d / "metrics.csv").open()))
        updates = max(int(r["step"]) for r in rows if r["step"]) + 1
        greedy = [float(r["val/bleu"]) for r in rows if r.get("val/bleu")]
        test = [f"{b:.2f} ({a})" for (s, a), b in scores.items() if s == "test"]
        vals = [f"{scores[('val', a)]:.2f}" if ("val", a) in scores else "-" for a in alphas]
        print(
            d.name,
            (d / "overrides.txt").read_text().strip() or "-",
            updates,
            f"{greedy[-1]:.2f}",
            *vals,
            test[0] if test else "-",
            sep="\t",
        )


if __name__ == "__main__":
    main(sys.argv[1:])
