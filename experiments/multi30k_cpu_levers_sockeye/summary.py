"""The levers' table from their records: python summary.py runs/*  (each a lever.sh output,
or its copy here). Greedy val BLEU at each validation comes from the run's metrics.csv; the
averaged checkpoint's beam-4 tokenized BLEU from scores.tsv (absent for a run stopped early)."""

import csv
import sys
from pathlib import Path

ALPHAS = ("1.0", "1.5", "2.0")


def main(dirs: list[str]) -> None:
    print(
        "name",
        "overrides",
        "updates",
        "greedy val, last",
        *(f"val a{a}" for a in ALPHAS),
        "test2016 (a)",
        sep="\t",
    )
    for d in map(Path, dirs):
        rows = list(csv.DictReader((d / "metrics.csv").open()))
        updates = max(int(r["step"]) for r in rows if r["step"]) + 1
        greedy = [float(r["val/bleu"]) for r in rows if r.get("val/bleu")]
        scores = {}
        if (d / "scores.tsv").exists():
            for line in (d / "scores.tsv").read_text().splitlines():
                split, alpha, bleu = line.split("\t")
                scores[split, alpha] = float(bleu)
        test = [f"{b:.2f} ({a})" for (s, a), b in scores.items() if s == "test"]
        vals = [f"{scores[('val', a)]:.2f}" if ("val", a) in scores else "-" for a in ALPHAS]
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
