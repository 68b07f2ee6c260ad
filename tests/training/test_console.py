"""The console of a short run: every line once, no library noise, and a closing summary whose
paths exist and whose commands name the tested checkpoint."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.helpers import cli, cli_overrides, run_dirs

NOISE = ("💡", "litlogger", "LeafSpec", "FLOPs │", "Total FLOPs: 0")


@pytest.mark.slow
def test_a_run_prints_each_line_once_without_noise_and_ends_with_a_summary(tmp_path):
    steps = ["trainer.max_steps=12", "trainer.max_epochs=-1", "trainer.val_check_interval=12"]
    steps += ["trainer.check_val_every_n_epoch=null", "model=tiny", "logger=csv"]
    result = cli([*cli_overrides(tmp_path), *steps, "trainer.enable_progress_bar=false"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    console = result.stdout + result.stderr
    lines = [line for line in console.splitlines() if line.strip() and not _box(line[0])]
    messages = [_message(line) for line in lines]  # (table rows of sample translations aside)
    messages = [m for m in messages if m and set(m) not in ({"="}, {"-"})]  # rules
    repeated = {m for m in messages if messages.count(m) > 1}
    assert not repeated, repeated
    assert not [line for line in console.splitlines() if any(n in line for n in NOISE)]
    assert "MFLOP per training step" in console

    (run,) = run_dirs(tmp_path)
    summary = result.stdout[result.stdout.rindex("=" * 72, 0, -80) :]
    fields = dict(
        line.split(":", 1) for line in summary.splitlines() if ":" in line and "python" not in line
    )
    assert Path(fields["run directory"].strip()) == run
    for label in ("model (tested)", "last checkpoint", "metrics", "tokenizer", "log"):
        assert Path(fields[label].strip()).exists(), label
    assert "test/bleu = " in fields["result"]
    tested = fields["model (tested)"].strip()
    assert f"python evaluate.py ckpt_path={shlex.quote(tested)}" in summary
    assert f"python translate.py ckpt_path={shlex.quote(tested)}" in summary


def _box(char: str) -> bool:
    """A box-drawing character: rows of the sample-translation table, which may repeat."""
    return "\u2500" <= char <= "\u257f"


def _message(line: str) -> str:
    """The message of a log line without its timestamp/logger prefix (both formats)."""
    if line.startswith("[") and "] - " in line:
        return line.split("] - ", 1)[1]
    return line.removeprefix("INFO: ")


def test_the_summary_names_the_wandb_run(tmp_path):
    from aiayn.console import closing_summary

    offline = tmp_path / "wandb" / "offline-run-20261123_120000-abc"
    offline.mkdir(parents=True)
    text = closing_summary({"run_dir": str(tmp_path), "test": {"test/bleu": 12.5}})
    assert f"W&B run:         {offline}" in text and "test/bleu = 12.50" in text


def test_progress_bars_need_standard_output_on_a_terminal_too(monkeypatch):
    """`translate.py > out.txt`: standard output redirected, so no bar even when standard
    error is a terminal (forced here with TTY_COMPATIBLE, which rich honours)."""
    import io

    from aiayn import console

    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert console.progress_console().is_terminal is False
