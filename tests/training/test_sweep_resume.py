"""Resumable sweeps (`resume_sweep=<multirun dir>`, aiayn.training.sweep_resume): a relaunch
keeps finished jobs, resumes stopped ones exactly, runs the rest, and refuses another grid or
recipe by name before any job runs."""

import json
import signal

import pytest
import torch
from omegaconf import OmegaConf, open_dict

from aiayn.errors import ConfigError
from aiayn.training.sweep_resume import (
    _check_same_job,
    _set_aside,
    check_relaunch,
    config_differences,
    job_overrides,
)
from tests.helpers import (
    cli,
    cli_overrides,
    compose_with_hydra,
    read_wandb_records,
    reported,
    rounded,
)

CORE = ["experiment=multi30k_cpu_table3", "sweep=table3_core"]


def _saved_sweep(tmp_path, overrides):
    """A multirun directory whose multirun.yaml is the sweep `overrides` compose."""
    config = compose_with_hydra("train", overrides)
    directory = tmp_path / "sweep"
    directory.mkdir()
    OmegaConf.save(config, directory / "multirun.yaml")
    return directory


def test_jobs_are_the_grid_hydra_expands_in_its_order():
    jobs = job_overrides(compose_with_hydra("train", [*CORE, "seed=7"]))
    assert jobs[0] == (
        "ablation=base",
        "experiment=multi30k_cpu_table3",
        "sweep=table3_core",
        "seed=7",
    )
    assert [j[0] for j in jobs[:4]] == [
        "ablation=base",
        "ablation=base_seed1235",
        "ablation=base_seed1236",
        "ablation=A_h1",
    ]
    assert len(jobs) == 15


def test_the_same_sweep_is_accepted(tmp_path):
    directory = _saved_sweep(tmp_path, CORE)
    relaunch = compose_with_hydra("train", [*CORE, f"resume_sweep={directory}"])
    check_relaunch(directory, relaunch)  # resume_sweep itself is no difference


def test_another_grid_is_refused_naming_the_first_jobs_that_differ(tmp_path):
    directory = _saved_sweep(tmp_path, CORE)
    relaunch = compose_with_hydra("train", ["experiment=multi30k_cpu_table3", "sweep=heads"])
    with pytest.raises(ConfigError) as error:
        check_relaunch(directory, relaunch)
    message = str(error.value)
    assert "another grid" in message
    assert (
        "job 1: ablation=base_seed1235 experiment=multi30k_cpu_table3 sweep=table3_core" in message
    )
    assert "-> ablation=A_h1 experiment=multi30k_cpu_table3 sweep=heads" in message
    assert "15 jobs -> 6" in message


def test_a_changed_recipe_is_refused_naming_the_key(tmp_path):
    directory = _saved_sweep(tmp_path, CORE)
    saved = OmegaConf.load(directory / "multirun.yaml")
    saved.trainer.max_steps = 300  # the recipe file said 300 when the sweep started
    OmegaConf.save(saved, directory / "multirun.yaml")
    with pytest.raises(ConfigError, match=r"recipe changed .*trainer\.max_steps: 300 -> 2000"):
        check_relaunch(directory, compose_with_hydra("train", CORE))


def test_a_directory_without_a_multirun_and_another_sweeper_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="not a multirun directory"):
        check_relaunch(tmp_path, compose_with_hydra("train", CORE))
    directory = _saved_sweep(tmp_path, CORE)
    optuna = compose_with_hydra("train", ["hparams_search=optuna"])
    with pytest.raises(ConfigError, match="study's storage"):
        check_relaunch(directory, optuna)


def test_config_differences_name_dotted_keys_and_skip_the_resume_keys():
    old = {"a": {"b": 1, "c": "${x}"}, "resume_sweep": None, "ckpt_path": None}
    new = {"a": {"b": 2, "c": "${x}", "d": 0}, "resume_sweep": "/s", "ckpt_path": "/l.ckpt"}
    assert config_differences(old, new) == ["a.b: 1 -> 2", "a.d: '(not set)' -> 0"]


def test_a_job_whose_config_file_changed_is_refused_naming_the_key(tmp_path):
    """An edited conf/ablation/ file changes one job's config, not the grid."""
    job = tmp_path / "3"
    (job / ".hydra").mkdir(parents=True)
    first, now = (
        compose_with_hydra("train", overrides)
        for overrides in (["ablation=A_h1"], ["ablation=A_h1", "model.num_heads=2"])
    )
    for config in (first, now):  # a job's config, as Hydra hands it to the job
        with open_dict(config):
            del config["hydra"]
    OmegaConf.save(["ablation=A_h1"], job / ".hydra" / "overrides.yaml")
    OmegaConf.save(first, job / ".hydra" / "config.yaml")
    with pytest.raises(ConfigError, match=r"config changed .*model\.num_heads: 1 -> 2"):
        _check_same_job(job, now, ["ablation=A_h1", f"resume_sweep={tmp_path}"])
    with pytest.raises(ConfigError, match="ran with the overrides ablation=A_h1"):
        _check_same_job(job, now, ["ablation=A_h2"])


def test_a_job_stopped_before_its_first_checkpoint_is_set_aside(tmp_path):
    """Its CSV rows and records move into interrupted-<time>/; .hydra and the log stay."""
    job = tmp_path / "1"
    for name in (".hydra/config.yaml", "csv/metrics.csv", "samples.jsonl", "train.log", "FAILED"):
        (job / name).parent.mkdir(parents=True, exist_ok=True)
        (job / name).write_text(name)
    _set_aside(job)
    (aside,) = job.glob("interrupted-*")
    assert sorted(p.name for p in job.iterdir()) == sorted([".hydra", "train.log", aside.name])
    assert (aside / "csv" / "metrics.csv").read_text() == "csv/metrics.csv"
    assert sorted(p.name for p in aside.iterdir()) == ["FAILED", "csv", "samples.jsonl"]


def test_resume_sweep_without_multirun_is_one_line(tmp_path):
    """Refused before the training stack is imported: here importing it would fail."""
    no_trainer = "import sys; sys.modules['aiayn.training.run'] = None; import runpy; "
    no_trainer += "runpy.run_path('train.py', run_name='__main__')"
    args = ["-c", no_trainer, *cli_overrides(tmp_path), f"resume_sweep={tmp_path}"]
    result = cli(args, tmp_path, module="")
    assert result.returncode == 1
    assert "resume_sweep relaunches a multirun: add -m" in result.stderr
    assert "Traceback" not in result.stderr


STEPS = 10  # each job: validation and last.ckpt at update 10, the end at 20
SWEEP = [
    "data.toy.train_size=1500",
    "data.toy.val_size=60",
    "data.toy.test_size=60",
    "data.max_tokens=512",
    "model.dropout=0.2",
    "seed=1,2,3",
    f"trainer.max_steps={2 * STEPS}",
    "trainer.max_epochs=-1",
    f"trainer.val_check_interval={STEPS}",
    "trainer.check_val_every_n_epoch=null",
    "logger=[csv,wandb]",
    "+callbacks.kill._target_=tests.training.callbacks.KillJobAtStep",
    f"+callbacks.kill.step={STEPS}",
]


def _sweep(tmp_path, *extra, grid=SWEEP):
    result = cli(["-m", *cli_overrides(tmp_path), *grid, *extra], tmp_path, timeout=1200)
    sweeps = list((tmp_path / "logs" / "train" / "multiruns").iterdir())
    return result, sweeps


def _wandb_groups(job):
    groups = set()
    for log in job.glob("wandb/offline-run-*/*.wandb"):
        records = read_wandb_records(log)
        groups |= {r.run.run_group for r in records if r.WhichOneof("record_type") == "run"}
    return groups


@pytest.mark.slow
def test_a_sweep_killed_in_its_second_job_and_relaunched_equals_an_uninterrupted_one(
    tmp_path, monkeypatch
):
    """Three jobs; SIGKILL in job 1 at update 10 (after its last.ckpt); the relaunch with
    resume_sweep keeps job 0 as it was, resumes job 1 from update 10 and runs job 2: every
    job's metrics.json equals the uninterrupted sweep's (timings aside), and the report and
    the W&B group see one sweep."""
    straight, (straight_dir,) = _sweep(tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]

    killed_path = tmp_path / "killed"
    monkeypatch.setenv("AIAYN_TEST_KILL_JOB", "1")
    killed, (sweep_dir,) = _sweep(killed_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert (sweep_dir / "0" / "metrics.json").is_file()
    last = sweep_dir / "1" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == STEPS
    assert not (sweep_dir / "1" / "metrics.json").exists()
    assert not (sweep_dir / "2").exists()
    finished = {  # what job 0 wrote (its log, train.log, says it was kept)
        p: p.stat().st_mtime_ns
        for p in (sweep_dir / "0").rglob("*")
        if p.is_file() and p.suffix != ".log"
    }

    monkeypatch.delenv("AIAYN_TEST_KILL_JOB")
    relaunch, sweeps = _sweep(killed_path, f"resume_sweep={sweep_dir}")
    assert relaunch.returncode == 0, relaunch.stderr[-3000:]
    assert sweeps == [sweep_dir]  # no second multirun directory
    assert "job 0 finished in an earlier attempt: kept" in relaunch.stdout + relaunch.stderr
    for path, mtime in finished.items():  # job 0 was not run again: nothing of it rewritten
        assert path.stat().st_mtime_ns == mtime, path
    resumed = json.loads((sweep_dir / "1" / "metrics.json").read_text())
    assert resumed["resumed_from"] == str(last)
    for job in ("0", "1", "2"):
        assert rounded(reported(sweep_dir / job)) == rounded(reported(straight_dir / job)), job
    # one sweep: the report lists the three jobs; every W&B run is in the sweep's group
    report = cli([str(sweep_dir)], killed_path, module="aiayn.sweeps")
    assert report.returncode == 0, report.stderr[-3000:]
    rows = [r for r in (sweep_dir / "sweep.csv").read_text().splitlines()[1:] if r]
    assert len(rows) == 3
    for job in ("0", "1", "2"):
        assert _wandb_groups(sweep_dir / job) == {sweep_dir.name}, job
    assert len(list((sweep_dir / "1").glob("wandb/offline-run-*"))) == 2  # killed + resumed

    # the same relaunch with another grid is refused before any job runs
    fewer = [o if o != "seed=1,2,3" else "seed=1,2" for o in SWEEP]
    other, _ = _sweep(killed_path, f"resume_sweep={sweep_dir}", grid=fewer)
    assert other.returncode == 1
    assert "another grid" in other.stderr and "3 jobs -> 2" in other.stderr
    assert "Traceback" not in other.stderr
