"""One command surface: `aiayn <command>` and `python -m aiayn <command>` run the same tools as
`python train.py`, `python -m aiayn.averaging` and the rest, with each command's own `--help`,
and Lightning's DDP launcher restarts the command it was given."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.cli.main import COMMANDS
from tests.helpers import REPO, SIXTY_STEPS, cli_overrides, run_dirs

AIAYN = Path(sys.executable).with_name("aiayn")  # the console script pip installs beside python
HYDRA = ("train", "evaluate", "translate", "prepare", "export", "visualize")


def aiayn(*args: str, module: bool = False, timeout: int = 300) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "aiayn"] if module else [str(AIAYN)]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    return subprocess.run(
        [*command, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_console_script_is_installed():
    assert AIAYN.exists(), "pip install -e . writes the aiayn console script (pyproject scripts)"


@pytest.mark.parametrize("module", [False, True], ids=["aiayn", "python -m aiayn"])
def test_help_lists_every_command_with_its_long_form(module):
    result = aiayn("--help", module=module)
    assert result.returncode == 0, result.stderr
    for name, (_, _, long_form) in COMMANDS.items():
        assert f"  {name} " in result.stdout and long_form in result.stdout
    assert set(COMMANDS) == {*HYDRA, "average", "sweeps", "curves"}


def test_an_unknown_or_missing_command_is_refused_with_the_list():
    unknown = aiayn("trian")
    assert unknown.returncode == 2
    assert "unknown command 'trian'" in unknown.stderr and "  train " in unknown.stderr
    assert aiayn().returncode == 2


@pytest.mark.parametrize(  # each help composes its command's tree: one in the fast layer
    "name",
    [n if n == "train" else pytest.param(n, marks=pytest.mark.slow) for n in HYDRA],
)
def test_each_hydra_command_help_shows_its_groups_and_keys(name, capsys, monkeypatch):
    """In this process, as the console script runs it (`main` with the command's argv)."""
    from hydra.core.global_hydra import GlobalHydra

    from aiayn.cli.main import main

    monkeypatch.setattr(sys, "argv", ["aiayn", name, "--help"])
    GlobalHydra.instance().clear()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # Hydra configures logging as it starts
    try:
        with pytest.raises(SystemExit) as exit:
            main()
    finally:
        root.handlers[:], root.level = handlers, level
    assert exit.value.code in (None, 0)
    shown = capsys.readouterr().out
    assert "== Configuration groups ==" in shown and "== Config ==" in shown
    assert "decode:" in shown or "data:" in shown  # the keys, composed


@pytest.mark.parametrize(
    ("name", "argument"), [("average", "--last"), ("sweeps", "--paper"), ("curves", "-o")]
)
def test_each_file_utility_help_shows_its_arguments(name, argument):
    result = aiayn(name, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: aiayn {name}") and argument in result.stdout


@pytest.mark.slow  # the fast layer has it through train.py (tests/reliability)
def test_a_users_mistake_through_the_console_script_is_one_line(tmp_path):
    wrong = aiayn("train", "trainer.max_steps=many", f"paths.log_dir={tmp_path}")
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    assert "trainer.max_steps='many'" in wrong.stderr


@pytest.mark.slow
def test_aiayn_train_trains_as_train_py_does(tmp_path):
    """The same run through the console script: its run directory, metrics and a test score,
    and Hydra's job name is still `train`."""
    result = aiayn("train", *cli_overrides(tmp_path), *SIXTY_STEPS, "data.toy.train_size=400")
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["fit"]["train/loss"] < 7 and "test/bleu" in metrics["test"]
    assert (run / "train.log").exists()


@pytest.mark.slow
@pytest.mark.parametrize("module", [False, True], ids=["aiayn", "python -m aiayn"])
def test_ddp_restarts_the_command_it_was_given(module, tmp_path):
    """Lightning starts rank 1 from `sys.argv` and `__main__.__spec__`: both forms must give
    it `aiayn.cli.train` and the same overrides."""
    args = [*cli_overrides(tmp_path), "trainer.accelerator=cpu", "trainer.devices=2"]
    args += ["trainer.max_steps=10", "trainer.max_epochs=-1", "data.toy.train_size=400"]
    args += ["trainer.val_check_interval=10", "trainer.check_val_every_n_epoch=null"]
    result = aiayn("train", *args, module=module, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Starting with 2 processes" in result.stdout + result.stderr
    (run,) = run_dirs(tmp_path)
    assert json.loads((run / "metrics.json").read_text())["fit"]["train/loss"] > 0
