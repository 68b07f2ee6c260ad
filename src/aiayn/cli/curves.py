"""`python -m aiayn.cli.curves <run dir> [<run dir> ...] [-o curves.png]`: val/bleu and
val/loss of a run (or of several, overlaid and labelled by directory name) against wall-clock
minutes, drawn from each run's `csv/metrics.csv`.

Validation rows carry the step; their time is the `train/elapsed_min` logged at that step.
Prints the table it plots (step, minutes, val/loss, val/bleu), for records in `experiments/`.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from aiayn.errors import AiaynError, exit_on_error
from aiayn.outputs import check_output


def validation_curve(run_dir: Path) -> list[dict[str, float]]:
    """One row per validation: step, minutes, val/loss, val/bleu (NaN where not logged)."""
    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        raise AiaynError(f"{path} not found: give a run directory written with logger=csv")
    with open(path, newline="") as file:
        reader = csv.DictReader(file)
        rows = [(reader.line_num, row) for row in reader]
    minutes: dict[int, float] = {}
    for line, row in rows:
        if row.get("train/elapsed_min"):
            step = int(_number(row, "step", path, line))
            minutes[step] = _number(row, "train/elapsed_min", path, line)
    curve = []
    for line, row in rows:
        if not row.get("val/loss"):
            continue
        step = int(_number(row, "step", path, line))
        known = [s for s in minutes if s <= step]
        curve.append(
            {
                "step": step,
                "minutes": minutes[max(known)] if known else float("nan"),
                "val/loss": _number(row, "val/loss", path, line),
                "val/bleu": _number(row, "val/bleu", path, line)
                if row.get("val/bleu")
                else math.nan,
            }
        )
    return curve


def _number(row: dict[str, str], key: str, path: Path, line: int) -> float:
    """The number in column `key`; AiaynError naming the file, line and column if it is not."""
    try:
        return float(row[key])
    except (KeyError, TypeError, ValueError):
        raise AiaynError(
            f"{path}, line {line}: column {key} holds {row.get(key)!r}, not a number: a "
            "damaged or hand-edited metrics file"
        ) from None


def check_picture(output: Path) -> None:
    """A file type matplotlib writes (the suffix), else AiaynError listing them."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    kinds = FigureCanvasAgg.get_supported_filetypes()
    suffix = output.suffix.lstrip(".").lower()
    if suffix and suffix not in kinds:
        raise AiaynError(
            f"-o {output}: matplotlib cannot write a .{suffix} picture; use one of "
            f"{', '.join('.' + k for k in sorted(kinds))}"
        )


def plot(curves: dict[str, list[dict[str, float]]], output: Path, title: str) -> None:
    """Two panels (val/bleu, val/loss against minutes), one line per labelled curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for label, curve in curves.items():
        minutes = [r["minutes"] for r in curve]
        left.plot(minutes, [r["val/bleu"] for r in curve], marker="o", label=label)
        right.plot(minutes, [r["val/loss"] for r in curve], marker="o", label=label)
    left.set_ylabel("val/bleu")
    right.set_ylabel("val/loss (NLL per token)")
    for ax in (left, right):
        ax.set_xlabel("wall clock (minutes)")
        ax.grid(alpha=0.3)
        if len(curves) > 1:
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)


@exit_on_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="aiayn curves", description=__doc__)
    parser.add_argument("run_dir", type=Path, nargs="+")
    parser.add_argument("-o", "--output", type=Path, help="PNG (default <run dir>/curves.png)")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    curves = {}
    for run_dir in args.run_dir:
        curves[run_dir.name] = validation_curve(run_dir)
        if not curves[run_dir.name]:
            raise AiaynError(f"{run_dir}: no validation rows in csv/metrics.csv")
    output = args.output or args.run_dir[0] / "curves.png"
    check_output(output, "-o", {"a run's": [d / "csv" / "metrics.csv" for d in args.run_dir]})
    check_picture(output)
    plot(curves, output, args.title or " vs ".join(curves))
    for label, curve in curves.items():
        print(f"{label}\n| step | minutes | val/loss | val/bleu |\n|---:|---:|---:|---:|")
        for r in curve:
            print(
                f"| {r['step']} | {r['minutes']:.1f} | {r['val/loss']:.3f} | {r['val/bleu']:.2f} |"
            )
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
