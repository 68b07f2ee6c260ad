"""The Table 3 report: a sweep's jobs beside the paper's rows.

`python -m aiayn.sweeps <multirun dir> [<more dirs> ...] --paper table3` reads every job of
the given multiruns (one job per `ablation=<row>` of conf/ablation/, several seeds of a row
allowed), and writes `table3.md`, `table3.csv`, `table3.png` and `table3_curves.png` into the
first directory.

A row's seeds are its jobs: `ablation=<row>` with different `seed=`s, or the ablation
`<row>_seed<N>` (conf/ablation/base_seed1235.yaml: a seed inside one grid).

Per row: its settings, parameters, val PPL and val BLEU (the last validation), test BLEU,
wall clock, the paper's dev PPL/BLEU (newstest2013, Table 3 of Vaswani et al. 2017), our
change against the sweep's `base` row next to the paper's change against its base, and a
verdict: `same direction`, `opposite`, or `within noise` when our change is no larger than the
noise, measured as twice the standard deviation of the base row's seeds (needs >= 2 base
seeds; else every verdict says `no noise estimate`). A row whose paper change is zero gets
`paper: no change` unless ours is within noise.

Convergence (`converged_at`, a line under the table): the first validation after which the
base row's mean val loss falls by no more than its seeds' noise (2σ) over the next
`WINDOW` updates; else how much it still fell over the last window.

`table3_curves.png`: one line of panels per Table 3 group (A, B, C, D, E, norm): val BLEU
against updates and against wall-clock minutes, and val PPL against updates, for the base and
each row of the group; a row's seeds are drawn as their mean with a band from the lowest to
the highest seed, and a marker at the end of each row's curve shows where the paper's change
for that row would put it (our base's last value + the paper's Δ).
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from aiayn.cli.curves import validation_curve
from aiayn.errors import AiaynError
from aiayn.outputs import check_output
from aiayn.records import finished, read_metrics

# Table 3 of the paper (dev set newstest2013): row -> (PPL, BLEU). Our conf/ablation/ rows are
# matched to the paper's by what they change relative to the base (d_k for the heads rows:
# the recipe's base has the paper's d_k = 64 with d_model 256 and 4 heads).
PAPER: dict[str, tuple[float, float]] = {
    "base": (4.92, 25.8),
    "A_h1": (5.29, 24.9),  # one head
    "A_h2": (5.00, 25.5),  # d_k 128 (paper: h=4)
    "A_h8": (4.91, 25.8),  # d_k 32 (paper: h=16)
    "A_h16": (5.01, 25.4),  # d_k 16 (paper: h=32)
    "B_dk16": (5.16, 25.1),
    "B_dk32": (5.01, 25.4),
    "C_N2": (6.11, 23.7),
    "C_N4": (5.19, 25.3),
    "C_N8": (4.88, 25.5),
    "C_dmodel_half": (5.75, 24.5),
    "C_dmodel_double": (4.66, 26.0),
    "C_dff_half": (5.12, 25.4),
    "C_dff_double": (4.75, 26.2),
    "D_dropout0": (5.77, 24.6),
    "D_dropout_up": (4.95, 25.5),
    "D_ls0": (4.67, 25.3),
    "D_ls2": (5.47, 25.7),
    "E_learned": (4.92, 25.7),
    "big": (4.33, 26.4),  # d_model, d_ff and heads doubled, dropout 0.3 (and trained longer)
}
COLUMNS = (
    "row",
    "seeds",
    "parameters",
    "val PPL",
    "val BLEU",
    "test BLEU",
    "minutes",
    "paper PPL",
    "paper BLEU",
    "Δ BLEU",
    "paper Δ BLEU",
    "BLEU verdict",
    "Δ PPL",
    "paper Δ PPL",
    "PPL verdict",
)


@dataclass
class Row:
    """One ablation row: the metrics of each of its jobs (seeds)."""

    name: str
    jobs: list[dict[str, Any]] = field(default_factory=list)

    def mean(self, key: str) -> float | None:
        values = [j[key] for j in self.jobs if j.get(key) is not None]
        return statistics.fmean(values) if values else None


def read_jobs(multirun_dirs: list[Path]) -> list[dict[str, Any]]:
    """Every finished job of the multiruns: its ablation row and metrics."""
    jobs = []
    for directory in multirun_dirs:
        for overrides_file in sorted(directory.glob("*/.hydra/overrides.yaml"), key=_job_order):
            job = overrides_file.parent.parent
            overrides = yaml.safe_load(overrides_file.read_text()) or []
            row = next((o.split("=", 1)[1] for o in overrides if o.startswith("ablation=")), None)
            row = None if row is None else re.sub(r"_seed\d+$", "", row)  # a seed of the row
            metrics = read_metrics(job)
            if row is None or not finished(metrics):
                continue
            fit, test = metrics.get("fit", {}), metrics.get("test") or {}
            jobs.append(
                {
                    "row": row,
                    "job": str(job),
                    "parameters": metrics.get("parameters", {}).get("total"),
                    "val PPL": fit.get("val/ppl"),
                    "val BLEU": fit.get("val/bleu"),
                    "test BLEU": test.get("test/bleu"),
                    "minutes": metrics.get("wall_clock_min"),
                    "curve": _curve(job),
                }
            )
    return jobs


def _job_order(overrides_file: Path) -> tuple[int, str]:
    """Jobs in launch order: `10` after `9` (Hydra numbers the job directories)."""
    name = overrides_file.parent.parent.name
    return (int(name), "") if name.isdigit() else (1 << 30, name)


def _curve(job: Path) -> list[dict[str, float]]:
    """The job's validations (step, minutes, val/loss, val/bleu), [] without a CSV log."""
    try:
        return validation_curve(job)
    except AiaynError:
        return []


def bands(jobs: list[dict[str, Any]], x: str, y: str) -> list[tuple[float, float, float, float]]:
    """(x, mean, lowest, highest) of metric `y` over the seeds `jobs`, at each validation all
    of them reached (matched by position; x is the seeds' mean). `y` 'val/ppl' is
    exp(val/loss)."""
    curves = [j["curve"] for j in jobs if j.get("curve")]
    out = []
    for points in zip(*curves, strict=False):  # stops at the shortest seed
        xs = [p[x] for p in points]
        ys = [math.exp(p["val/loss"]) if y == "val/ppl" else p[y] for p in points]
        out.append((statistics.fmean(xs), statistics.fmean(ys), min(ys), max(ys)))
    return out


WINDOW = 500  # updates over which the base row's val loss must still fall by more than noise


def converged_at(jobs: list[dict[str, Any]], window: int = WINDOW) -> str:
    """Where the seeds `jobs` (>= 2 with curves) stop improving: `converged at update U`
    (the first validation after which the mean val loss falls by no more than 2σ of the
    seeds, σ taken at U + window, over the next `window` updates), else `still improving`
    with the last window's fall and noise."""
    curves = [j["curve"] for j in jobs if j.get("curve")]
    if len(curves) < 2:
        return "convergence: needs >= 2 seeds with curves"
    points = []
    for same in zip(*curves, strict=False):
        losses = [p["val/loss"] for p in same]
        points.append((same[0]["step"], statistics.fmean(losses), 2 * statistics.stdev(losses)))
    fall, noise = math.nan, math.nan
    for step, loss, _ in points:
        later = [p for p in points if p[0] >= step + window]
        if not later:
            break
        _, later_loss, noise = later[0]
        fall = loss - later_loss
        if fall <= noise:
            return (
                f"converged at update {step}: the mean val loss of {len(curves)} seeds falls "
                f"by {fall:.3f} over the next {window} updates, within the seeds' noise "
                f"(2σ {noise:.3f})"
            )
    last = points[-1]
    return (
        f"still improving at update {last[0]}: the mean val loss of {len(curves)} seeds "
        f"({last[1]:.3f}) fell by {fall:.3f} over the last {window} updates, more than the "
        f"seeds' noise (2σ {noise:.3f})"
    )


def verdict(ours: float | None, paper: float | None, noise: float | None) -> str:
    if ours is None or paper is None:
        return ""
    if noise is None:
        return "no noise estimate"
    if abs(ours) <= noise:
        return "within noise"
    if paper == 0:
        return "paper: no change"
    return "same direction" if (ours > 0) == (paper > 0) else "opposite"


def report(multirun_dirs: list[Path]) -> list[dict[str, Any]]:
    """The report's rows: base first, then each row where its first job was launched (job
    directories in number order, the multiruns in the order given)."""
    jobs = read_jobs(multirun_dirs)
    rows: dict[str, Row] = {}
    for job in jobs:
        rows.setdefault(job["row"], Row(job["row"])).jobs.append(job)
    if "base" not in rows:
        raise AiaynError(
            f"no finished job with ablation=base in {', '.join(map(str, multirun_dirs))}: "
            "the report compares every row with the base row"
        )
    base = rows["base"]
    noise = {}
    for key in ("val BLEU", "val PPL"):
        values = [j[key] for j in base.jobs if j.get(key) is not None]
        noise[key] = 2 * statistics.stdev(values) if len(values) >= 2 else None
    paper_base = PAPER["base"]
    out = []
    for name in ["base", *[n for n in rows if n != "base"]]:
        row = rows[name]
        paper = PAPER.get(name)
        line: dict[str, Any] = {"row": name, "seeds": len(row.jobs)}
        if name == "base":
            line["convergence"] = converged_at(row.jobs)
        for key in ("parameters", "val PPL", "val BLEU", "test BLEU", "minutes"):
            line[key] = row.mean(key)
        if line["parameters"] is not None:  # the same for every seed of a row
            line["parameters"] = round(line["parameters"])
        line["paper PPL"], line["paper BLEU"] = paper if paper else (None, None)
        for metric, index, key in (("BLEU", 1, "val BLEU"), ("PPL", 0, "val PPL")):
            ours = _delta(row.mean(key), base.mean(key))
            theirs = round(paper[index] - paper_base[index], 2) if paper else None
            line[f"Δ {metric}"], line[f"paper Δ {metric}"] = ours, theirs
            line[f"{metric} verdict"] = "" if name == "base" else verdict(ours, theirs, noise[key])
        out.append(line)
    return out


def _delta(value: float | None, base: float | None) -> float | None:
    return None if value is None or base is None else value - base


def _fmt(value: Any, column: str) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:+.2f}" if "Δ" in column else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def write(rows: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """table3.md, table3.csv and table3.png (our Δ BLEU beside the paper's per row)."""
    md = out_dir / "table3.md"
    for name in ("table3.md", "table3.csv", "table3.png", "table3_curves.png"):
        check_output(out_dir / name, "the report")
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_fmt(r.get(c), c) for c in COLUMNS) + " |" for r in rows]
    base = next((r for r in rows if r["row"] == "base"), {})
    lines += ["", f"Base row: {base.get('convergence', '')}"]
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    table = out_dir / "table3.csv"
    with open(table, "w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return [md, table, _plot(rows, out_dir / "table3.png")]


def group_of(row: str) -> str:
    """The Table 3 group of an ablation row: `A_h1` -> 'A', `norm_pre` -> 'norm'."""
    return row.split("_", 1)[0]


def plot_curves(multirun_dirs: list[Path], path: Path) -> Path | None:
    """table3_curves.png (see the module docstring); None when no job logged a CSV curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = read_jobs(multirun_dirs)
    rows: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        rows.setdefault(job["row"], []).append(job)
    if "base" not in rows or not any(j["curve"] for j in jobs):
        return None
    groups = sorted({group_of(r) for r in rows if r != "base"})
    panels = (("steps", "val/bleu", "updates"), ("minutes", "val/bleu", "minutes"))
    panels += (("steps", "val/ppl", "updates"),)
    fig, axes = plt.subplots(
        max(len(groups), 1), 3, figsize=(14, 3.2 * max(len(groups), 1)), squeeze=False
    )
    for axis_row, group in zip(axes, groups or ["base"], strict=True):
        members = ["base", *[r for r in rows if r != "base" and group_of(r) == group]]
        for ax, (x, y, label) in zip(axis_row, panels, strict=True):
            key = "step" if x == "steps" else x
            base_end = (bands(rows["base"], key, y) or [(0.0, math.nan, 0.0, 0.0)])[-1][1]
            for index, name in enumerate(members):
                band = bands(rows[name], key, y)
                if not band:
                    continue
                color = "black" if name == "base" else f"C{index}"
                xs, mean, low, high = zip(*band, strict=True)
                seeds = len(rows[name])
                ax.plot(xs, mean, color=color, label=f"{name} ({seeds} seed{'s' * (seeds > 1)})")
                ax.fill_between(xs, low, high, color=color, alpha=0.2, linewidth=0)
                paper = PAPER.get(name)
                if paper and name != "base":
                    index = 1 if y == "val/bleu" else 0
                    delta = paper[index] - PAPER["base"][index]
                    ax.plot([xs[-1]], [base_end + delta], marker="D", color=color, alpha=0.7)
            ax.set_xlabel(label)
            ax.set_ylabel({"val/bleu": "val BLEU", "val/ppl": "val PPL (log scale)"}[y])
            if y == "val/ppl":  # early and diverged rows span decades
                ax.set_yscale("log")
            ax.set_title(f"{group}: {y} against {label}", fontsize=9)
            ax.grid(alpha=0.3)
        axis_row[0].legend(fontsize=7, loc="lower right")
    fig.suptitle("lines: mean over seeds, band: lowest to highest seed; ◆: base + paper's Δ")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _plot(rows: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["row"] != "base"]
    fig, ax = plt.subplots(figsize=(8, 0.45 * max(len(shown), 2) + 1.5))
    y = range(len(shown))
    ours = [r["Δ BLEU"] or 0.0 for r in shown]
    theirs = [r["paper Δ BLEU"] or 0.0 for r in shown]
    ax.barh([i - 0.2 for i in y], ours, height=0.4, label="ours (val BLEU - base)")
    ax.barh([i + 0.2 for i in y], theirs, height=0.4, label="paper (dev BLEU - base)")
    ax.set_yticks(list(y), [r["row"] for r in shown])
    ax.axvline(0, color="black", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("change in BLEU against the base row")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
