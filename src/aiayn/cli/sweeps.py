"""Summarise multiruns: `python -m aiayn.sweeps <multirun dir> [...] [--paper table3]`.

Reads each job's `.hydra/overrides.yaml` and `metrics.json` and writes `sweep.md`,
`sweep.csv` and `sweep.png` (val/bleu per job) into the multirun directory. Columns: the
overrides that vary between jobs, parameters, val/bleu and val/ppl of the last validation,
the best val/bleu, and mean training tokens/s (real source + target tokens).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

import yaml

from aiayn.cli import table3
from aiayn.errors import AiaynError, exit_on_error
from aiayn.outputs import check_output
from aiayn.records import finished, read_metrics, stopped_status

COLUMNS = (
    "job",
    "overrides",
    "parameters",
    "val/bleu",
    "val/ppl",
    "best val/bleu",
    "tokens/s",
    "status",
)


def collect(multirun_dir: Path) -> list[dict[str, Any]]:
    """One row per job directory (a folder holding .hydra/overrides.yaml), in job order."""
    rows = []
    jobs = [p.parent.parent for p in multirun_dir.glob("*/.hydra/overrides.yaml")]
    for job in sorted(jobs, key=lambda p: (len(p.name), p.name)):
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()) or []
        row: dict[str, Any] = {"job": job.name, "overrides": overrides}
        metrics = read_metrics(job)
        if metrics is None:
            rows.append({**row, "status": "failed or running (no metrics.json)"})
            continue
        if not finished(metrics):
            rows.append({**row, "status": stopped_status(metrics)})
            continue
        fit = metrics.get("fit", {})
        row.update(
            {
                "parameters": metrics.get("parameters", {}).get("total"),
                "val/bleu": fit.get("val/bleu"),  # the last validation's, as val/ppl
                "val/ppl": fit.get("val/ppl"),
                "best val/bleu": metrics.get("best", {}).get("val/bleu"),
                "tokens/s": metrics.get("train_tokens_per_sec"),
                "status": "done",
            }
        )
        rows.append(row)
    shared = set.intersection(*(set(r["overrides"]) for r in rows)) if rows else set()
    for row in rows:  # show what varies between the jobs, not what they all share
        row["overrides"] = " ".join(o for o in row["overrides"] if o not in shared)
    return rows


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def write_tables(rows: list[dict[str, Any]], out_dir: Path) -> tuple[Path, Path]:
    """sweep.md (Markdown table) and sweep.csv (raw values) in out_dir."""
    md = out_dir / "sweep.md"
    for path in (md, out_dir / "sweep.csv", out_dir / "sweep.png"):
        check_output(path, "multirun_dir's report")
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in COLUMNS) + " |" for r in rows]
    md.write_text("\n".join(lines) + "\n")
    csv_path = out_dir / "sweep.csv"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return md, csv_path


def plot(rows: list[dict[str, Any]], out_dir: Path) -> Path:
    """sweep.png: a horizontal bar of val/bleu per job, labelled by its overrides."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r.get("best val/bleu") is not None]
    fig, ax = plt.subplots(figsize=(8, 0.5 * max(len(done), 2) + 1.2))
    ax.barh([r["overrides"] or r["job"] for r in done], [r["best val/bleu"] for r in done])
    ax.invert_yaxis()
    ax.set_xlabel("val/bleu (best)")
    ax.set_title(out_dir.name)
    fig.tight_layout()
    path = out_dir / "sweep.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def summarise(multirun_dir: Path) -> list[Path]:
    rows = collect(multirun_dir)
    if not rows:
        raise AiaynError(
            f"{multirun_dir}: no job directories (*/.hydra/overrides.yaml) found; "
            "pass the directory a `python train.py -m ...` run printed"
        )
    return [*write_tables(rows, multirun_dir), plot(rows, multirun_dir)]


@exit_on_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="aiayn sweeps", description=__doc__)
    parser.add_argument("multirun_dirs", type=Path, nargs="+", metavar="multirun_dir")
    parser.add_argument(
        "--paper",
        choices=["table3"],
        help="also report the jobs beside the paper's Table 3 (aiayn.cli.table3)",
    )
    args = parser.parse_args(argv)
    first = args.multirun_dirs[0]
    for directory in args.multirun_dirs:
        for path in summarise(directory):
            print(path)
    print((first / "sweep.md").read_text())
    if args.paper == "table3":
        for path in table3.write(table3.report(args.multirun_dirs), first):
            print(path)
        curves = table3.plot_curves(args.multirun_dirs, first / "table3_curves.png")
        print(curves or "no job logged csv/metrics.csv: no table3_curves.png")
        print((first / "table3.md").read_text())


if __name__ == "__main__":
    main()
