"""`python -m aiayn.cli.curves <run dir> [-o curves.png]`: val/bleu and val/loss of a run
against wall-clock minutes (and updates), drawn from its `csv/metrics.csv`.

Validation rows carry the step; their time is the `train/elapsed_min` logged at that step.
Prints the table it plots (step, minutes, val/loss, val/bleu), for records in `experiments/`.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from aiayn.errors import AiaynError, exit_on_error


def validation_curve(run_dir: Path) -> list[dict[str, float]]:
    """One row per validation: step, minutes, val/loss, val/bleu (NaN where not logged)."""
    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        raise AiaynError(f"{path} not found: give a run directory written with logger=csv")
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    minutes: dict[int, float] = {}
    for row in rows:
        if row.get("train/elapsed_min"):
            minutes[int(row["step"])] = float(row["train/elapsed_min"])
    curve = []
    for row in rows:
        if not row.get("val/loss"):
            continue
        step = int(row["step"])
        known = [s for s in minutes if s <= step]
        curve.append(
            {
                "step": step,
                "minutes": minutes[max(known)] if known else float("nan"),
                "val/loss": float(row["val/loss"]),
                "val/bleu": float(row["val/bleu"]) if row.get("val/bleu") else float("nan"),
            }
        )
    return curve


def plot(curve: list[dict[str, float]], output: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    minutes = [r["minutes"] for r in curve]
    left.plot(minutes, [r["val/bleu"] for r in curve], marker="o")
    left.set_xlabel("wall clock (minutes)")
    left.set_ylabel("val/bleu")
    right.plot(minutes, [r["val/loss"] for r in curve], marker="o", color="tab:red")
    right.set_xlabel("wall clock (minutes)")
    right.set_ylabel("val/loss (NLL per token)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)


@exit_on_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m aiayn.cli.curves", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("-o", "--output", type=Path, help="PNG (default <run dir>/curves.png)")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    curve = validation_curve(args.run_dir)
    if not curve:
        raise AiaynError(f"{args.run_dir}: no validation rows in csv/metrics.csv")
    output = args.output or args.run_dir / "curves.png"
    plot(curve, output, args.title or args.run_dir.name)
    print("| step | minutes | val/loss | val/bleu |\n|---:|---:|---:|---:|")
    for r in curve:
        print(f"| {r['step']} | {r['minutes']:.1f} | {r['val/loss']:.3f} | {r['val/bleu']:.2f} |")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
