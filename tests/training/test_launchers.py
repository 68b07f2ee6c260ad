"""Which process of a torchrun/srun launch this is, and one run directory for all of them
(the real launches run in the slow layer: tests/training/test_slow.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from aiayn import launchers
from aiayn.config import new_run_dir
from aiayn.errors import ConfigError
from aiayn.launchers import Launch, external_launch

LAUNCH_VARIABLES = ("TORCHELASTIC_RUN_ID", "WORLD_SIZE", "RANK", "SLURM_PROCID", "SLURM_NTASKS")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (*LAUNCH_VARIABLES, "SLURM_JOB_NAME", "SLURM_JOB_ID", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_one_process_is_no_launch(env: pytest.MonkeyPatch) -> None:
    assert external_launch() is None
    env.setenv("SLURM_PROCID", "0")  # one task of an sbatch job: a plain run
    env.setenv("SLURM_NTASKS", "1")
    assert external_launch() is None


def test_torchrun_and_srun_ranks(env: pytest.MonkeyPatch) -> None:
    for name, value in {"TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": "4", "RANK": "3"}.items():
        env.setenv(name, value)
    env.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert external_launch() == Launch("torchrun", 3, 4, "1")
    for name in ("TORCHELASTIC_RUN_ID", "WORLD_SIZE", "RANK"):
        env.delenv(name)
    slurm = {"SLURM_PROCID": "1", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"}
    for name, value in slurm.items():
        env.setenv(name, value)
    assert external_launch() == Launch("slurm", 1, 8, "77.0.0")
    env.setenv("SLURM_JOB_NAME", "interactive")  # Lightning's opt-out: not a SLURM launch
    assert external_launch() is None


def test_every_srun_rank_gets_the_directory_rank_0_claims(tmp_path: Path) -> None:
    """Rank 1 asks before rank 0 has claimed: it waits for the name, then both agree; rank 0
    claimed exactly one new directory."""
    base = tmp_path / "runs" / "2026-01-01_00-00-00"
    base.mkdir(parents=True)  # taken by an earlier run: rank 0 claims <base>_1
    got: dict[int, str] = {}

    def rank(number: int) -> None:
        launch = Launch("slurm", number, 2, "5.0.0")
        got[number] = launch.share_run_dir(lambda: new_run_dir(str(base)), base.parent)

    waiting = threading.Thread(target=rank, args=(1,))
    waiting.start()
    rank(0)
    waiting.join(timeout=30)
    assert got == {0: f"{base}_1", 1: f"{base}_1"}
    assert sorted(p.name for p in base.parent.iterdir()) == [
        ".slurm-5.0.0",
        base.name,
        f"{base.name}_1",
    ]


def test_a_rank_waiting_in_vain_names_the_file_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launchers, "WAIT_SECONDS", 0.3)
    launch = Launch("slurm", 1, 2, "6.0.0")
    with pytest.raises(ConfigError, match=r"\.slurm-6\.0\.0: is .* shares.*hydra\.run\.dir"):
        launch.share_run_dir(lambda: pytest.fail("only rank 0 claims"), tmp_path)


def test_each_rank_of_an_external_launch_logs_to_its_own_file(env: pytest.MonkeyPatch) -> None:
    """Rank 0 (and a single process) logs to `train.log`; every other rank of torchrun or
    srun to `train_rank<r>.log`, so that no two processes append to one file (issue 49)."""
    from aiayn.launchers import log_file

    assert log_file("/runs/a", "train") == "/runs/a/train.log"
    for name, value in {"TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": "4", "RANK": "0"}.items():
        env.setenv(name, value)
    assert log_file("/runs/a", "train") == "/runs/a/train.log"
    env.setenv("RANK", "3")
    assert log_file("/runs/a", "train") == "/runs/a/train_rank3.log"
    for name in ("TORCHELASTIC_RUN_ID", "WORLD_SIZE", "RANK"):
        env.delenv(name)
    for name, value in {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7"}.items():
        env.setenv(name, value)
    assert log_file("/runs/a", "train") == "/runs/a/train_rank1.log"


def test_a_multirun_of_several_processes_under_lightnings_launcher_is_refused(tmp_path):
    """`train.py -m ... trainer.devices=2`: Lightning would restart the command, -m and the
    sweep included, in its second process, which would run the whole sweep again in a
    directory of its own (issue 49; on f5393e6 it ran). Every job is refused before any work
    in one line naming the launchers that work, and no run directory is left."""
    from tests.helpers import cli, cli_overrides

    args = ["-m", *cli_overrides(tmp_path), "model.num_heads=2,4", "trainer.accelerator=cpu"]
    args += ["trainer.devices=2", "trainer.strategy=ddp"]
    result = cli(args, tmp_path)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: job")]
    assert len(errors) == 2 and all("hydra/launcher=slurm_gpu" in line for line in errors)
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "logs" / "train" / "runs").exists()
    assert not list((tmp_path / "logs").rglob("*.ckpt"))
