"""The `--paper table3` report on a synthetic multirun with known numbers."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from aiayn.cli import table3
from aiayn.cli.sweeps import main


def _job(directory: Path, name: str, overrides: list[str], bleu: float, ppl: float) -> None:
    """A finished job; its csv/metrics.csv has three validations ending at `bleu`/`ppl`."""
    job = directory / name
    (job / ".hydra").mkdir(parents=True)
    (job / "csv").mkdir()
    lines = ["epoch,step,train/elapsed_min,val/loss,val/bleu"]
    for i, step in enumerate((10, 20, 30)):
        value = bleu - 2 * (2 - i)
        loss = math.log(ppl) + 0.1 * (2 - i)
        lines += [f"{i},{step},{step / 10},,", f"{i},{step},,{loss},{value}"]
    (job / "csv" / "metrics.csv").write_text("\n".join(lines) + "\n")
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    metrics = {
        "fit": {"val/bleu": bleu, "val/ppl": ppl},
        "test": {"test/bleu": bleu - 1.0},
        "parameters": {"total": 1000},
        "best": {"val/bleu": bleu},
        "wall_clock_min": 5.0,
    }
    (job / "metrics.json").write_text(json.dumps(metrics))


@pytest.fixture
def sweep(tmp_path: Path) -> tuple[Path, Path]:
    first, second = tmp_path / "part1", tmp_path / "part2"
    common = ["experiment=multi30k_cpu"]
    # base with three seeds: BLEU 30.0, 30.2, 29.8 -> stdev 0.2, noise 0.4
    for i, (seed, bleu) in enumerate([(1, 30.0), (2, 30.2), (3, 29.8)]):
        _job(first, str(i), [*common, "ablation=base", f"seed={seed}"], bleu, 6.0)
    _job(first, "3", [*common, "ablation=A_h1"], 28.0, 6.5)  # paper: -0.9 BLEU, +0.37 PPL
    _job(first, "4", [*common, "ablation=C_N2"], 31.0, 5.5)  # paper: -2.1 BLEU, +1.19 PPL
    _job(second, "0", [*common, "ablation=D_ls0"], 30.3, 5.8)  # paper: -0.5 BLEU
    _job(second, "1", [*common, "ablation=A_h8"], 29.0, 6.2)  # paper: no BLEU change
    _job(second, "2", [*common, "ablation=norm_pre"], 31.0, 5.9)  # no paper row
    return first, second


def test_report_puts_each_row_beside_the_paper_with_verdicts(sweep):
    rows = {r["row"]: r for r in table3.report(list(sweep))}
    assert next(iter(rows)) == "base" and rows["base"]["seeds"] == 3
    assert rows["base"]["val BLEU"] == pytest.approx(30.0)
    h1 = rows["A_h1"]
    assert (h1["paper PPL"], h1["paper BLEU"]) == (5.29, 24.9)
    assert h1["Δ BLEU"] == pytest.approx(-2.0) and h1["paper Δ BLEU"] == pytest.approx(-0.9)
    assert h1["BLEU verdict"] == "same direction" == h1["PPL verdict"]  # PPL +0.5, paper +0.37
    assert rows["C_N2"]["BLEU verdict"] == "opposite"
    assert rows["D_ls0"]["BLEU verdict"] == "within noise"  # +0.3 <= 2 x 0.2
    assert rows["A_h8"]["BLEU verdict"] == "paper: no change"
    assert rows["norm_pre"]["paper BLEU"] is None and rows["norm_pre"]["BLEU verdict"] == ""
    assert rows["C_N2"]["test BLEU"] == pytest.approx(30.0) and rows["C_N2"]["minutes"] == 5.0


def test_cli_writes_the_report_into_the_first_directory(sweep, capsys):
    first, second = sweep
    main([str(first), str(second), "--paper", "table3"])
    text = (first / "table3.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert table[0].startswith("| row | seeds | parameters |")
    assert len(table) == 2 + 6  # base, A_h1, C_N2, then the second part's rows
    # under the table: where the base row's 3 seeds stop improving (3 validations: too few)
    assert "Base row: still improving at update 30" in text
    a_h1 = next(line for line in table if line.startswith("| A_h1 "))
    assert "| -2.00 | -0.90 | same direction |" in a_h1
    assert a_h1.startswith("| A_h1 | 1 | 1,000 |")  # a count, not a mean
    assert (first / "table3.png").stat().st_size > 1000
    assert (first / "table3_curves.png").stat().st_size > 10_000
    assert "table3.md" in capsys.readouterr().out


def test_report_needs_a_base_row(tmp_path):
    _job(tmp_path, "0", ["ablation=A_h1"], 28.0, 6.5)
    with pytest.raises(table3.AiaynError, match="ablation=base"):
        table3.report([tmp_path])


def test_paper_numbers_are_table_3(tmp_path):
    """The values quoted in the issue and the paper (dev newstest2013, PPL / BLEU)."""
    assert table3.PAPER["base"] == (4.92, 25.8)
    assert table3.PAPER["C_dmodel_double"] == (4.66, 26.0)
    assert table3.PAPER["D_ls2"] == (5.47, 25.7)
    assert table3.PAPER["E_learned"] == (4.92, 25.7)
    assert table3.PAPER["big"] == (4.33, 26.4)
    assert len(table3.PAPER) == 20


def test_a_rows_seed_ablation_is_a_seed_of_that_row(tmp_path):
    """`ablation=base_seed1235` (a seed inside one grid, conf/ablation/) counts as a base seed."""
    _job(tmp_path, "0", ["ablation=base"], 30.0, 6.0)
    _job(tmp_path, "1", ["ablation=base_seed1235"], 31.0, 6.0)
    _job(tmp_path, "2", ["ablation=A_h1"], 28.0, 6.5)
    rows = {r["row"]: r for r in table3.report([tmp_path])}
    assert list(rows) == ["base", "A_h1"]
    assert rows["base"]["seeds"] == 2 and rows["base"]["val BLEU"] == pytest.approx(30.5)


def _seeds(last_step: int) -> list[dict]:
    """Three seeds of a val loss 2 + 100/step, offset by -0.01, 0, +0.01 (2σ = 0.02)."""
    steps = range(100, last_step + 1, 100)
    return [
        {"curve": [{"step": s, "val/loss": 2 + 100 / s + offset} for s in steps]}
        for offset in (-0.01, 0.0, 0.01)
    ]


def test_convergence_is_where_the_loss_falls_by_no_more_than_noise_over_the_window():
    # the fall over the next 200 updates: 0.0202 from update 900, 0.0167 from 1000
    assert table3.converged_at(_seeds(1500), window=200).startswith(
        "converged at update 1000: the mean val loss of 3 seeds falls by 0.017 over the next "
        "200 updates, within the seeds' noise (2σ 0.020)"
    )
    assert table3.converged_at(_seeds(800), window=200).startswith(
        "still improving at update 800: the mean val loss of 3 seeds (2.125) fell by 0.042"
    )
    assert "needs >= 2 seeds" in table3.converged_at(_seeds(800)[:1])


def test_without_base_seeds_there_is_no_noise_estimate():
    assert table3.verdict(-1.0, -0.9, None) == "no noise estimate"
    assert table3.verdict(-1.0, -0.9, 0.5) == "same direction"
    assert table3.verdict(0.4, -0.9, 0.5) == "within noise"


def test_curves_are_the_seeds_mean_and_spread(sweep):
    jobs = [j for j in table3.read_jobs(list(sweep)) if j["row"] == "base"]
    bleu = table3.bands(jobs, "step", "val/bleu")
    assert [b[0] for b in bleu] == [10, 20, 30]
    # seeds end at 30.0, 30.2, 29.8 and run 4 and 2 points lower before
    assert bleu[0][1:] == pytest.approx((26.0, 25.8, 26.2))
    assert bleu[-1][1:] == pytest.approx((30.0, 29.8, 30.2))
    ppl = table3.bands(jobs, "minutes", "val/ppl")
    assert [p[0] for p in ppl] == [1.0, 2.0, 3.0]
    assert ppl[-1][1] == pytest.approx(6.0)
    assert [table3.group_of(r) for r in ("A_h1", "C_dff_half", "norm_pre")] == ["A", "C", "norm"]


def test_jobs_are_read_in_launch_order(tmp_path):
    from aiayn.cli.table3 import _job_order

    files = [tmp_path / name / ".hydra" / "overrides.yaml" for name in ("10", "2", "1", "x")]
    assert [f.parent.parent.name for f in sorted(files, key=_job_order)] == ["1", "2", "10", "x"]


def test_the_gpu_script_s_two_parts_make_up_the_converged_grid():
    """sweep=table3_converged is every conf/ablation/ row; experiments/table3_converged/run4.sh
    runs it as two launches on one GPU (table3_core, then the other rows by name), which
    together are the grid, each row once."""
    repo = Path(__file__).resolve().parents[2]
    rows = {}
    for sweep in ("table3_converged", "table3_core"):
        text = (repo / "conf" / "sweep" / f"{sweep}.yaml").read_text()
        rows[sweep] = yaml.safe_load(text)["hydra"]["sweeper"]["params"]["ablation"].split(",")
    script = (repo / "experiments" / "table3_converged" / "run4.sh").read_text()
    (part2,) = re.findall(r'^  2\) GRID="ablation=([\w,]+)"', script, flags=re.M)
    assert 'GRID="sweep=table3_core"' in script
    both = rows["table3_core"] + part2.split(",")
    assert sorted(both) == sorted(rows["table3_converged"])
    assert len(set(both)) == len(both)
    available = {p.stem for p in (repo / "conf" / "ablation").glob("*.yaml")}
    assert set(both) == available  # every row conf/ablation/ holds, big and the seeds included


def test_gpu_carry_refuses_to_remake_the_corpus_it_would_copy_from():
    """experiments/gpu_carry.sh empties .gpu/multi30k before copying the corpus into it: given
    that folder itself as MULTI30K_ROOT it stops before any other step (here the wheels' step
    would fail otherwise, on a Python that cannot run), naming the folder."""
    import os
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "MULTI30K_ROOT": str(repo / ".gpu" / "multi30k"), "PY": "/bin/false"}
    done = subprocess.run(
        ["bash", str(repo / "experiments" / "gpu_carry.sh")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert "MULTI30K_ROOT is .gpu/multi30k itself" in done.stderr
