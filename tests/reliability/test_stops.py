"""The catalogue, part five: a stopped run says so. SIGTERM (a preemption, `scancel`) or
SIGINT (Ctrl-C) ends a run with exit code 128 + the signal, one line saying where it
stopped and how to resume, the checkpoint of the update it stopped at (SIGTERM) and a
`metrics.json` marked unfinished; a signal in a multirun job ends the sweep, naming the jobs
that did not run, and the relaunch finishes it. On f5393e6 every one of them exited 0 with
nothing on stderr and no metrics.json, and a sweep's remaining jobs silently never ran."""

from __future__ import annotations

import json
import signal

import pytest
import torch

from aiayn.cli.sweeps import collect
from tests.helpers import cli, cli_overrides, run_dirs

RUN = ["data.toy.train_size=1500", "data.toy.val_size=60", "data.toy.test_size=60"]
RUN += ["data.max_tokens=512", "model.dropout=0.0", "trainer.max_steps=12"]
RUN += ["trainer.max_epochs=-1", "trainer.val_check_interval=10"]
RUN += ["trainer.check_val_every_n_epoch=null", "test=false", "val_bleu=false"]
RUN += ["callbacks.model_checkpoint.monitor=val/loss", "callbacks.model_checkpoint.mode=min"]


def _signal_at(step: int, name: str) -> list[str]:
    kill = ["+callbacks.kill._target_=tests.training.callbacks.KillAtStep"]
    return [*kill, f"+callbacks.kill.step={step}", f"+callbacks.kill.signal={name}"]


def _weights(path):
    return torch.load(path, weights_only=True)["state_dict"]


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_a_sigterm_stops_with_143_one_line_and_its_update_saved_and_a_resume_is_exact(
    tmp_path,
):
    straight = cli([*cli_overrides(tmp_path / "straight"), *RUN], tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    where = tmp_path / "stopped"
    args = [*cli_overrides(where), *RUN]
    stopped = cli([*args, *_signal_at(5, "SIGTERM")], where)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    (run,) = run_dirs(where)
    last = run / "checkpoints" / "last.ckpt"
    assert _error_lines(stopped.stderr) == [
        f"error: SIGTERM stopped the run while training, at update 6; resume with "
        f"ckpt_path={last} (update 6)"
    ]
    assert "Traceback" not in stopped.stderr
    assert torch.load(last, weights_only=True)["global_step"] == 6  # the update it stopped at
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics == {
        "finished": False,
        "stopped_by": "SIGTERM",
        "stopped_while": "training",
        "updates": 6,
        "last_checkpoint": str(last),
        "last_checkpoint_update": 6,
        "run_dir": str(run),
    }
    resumed = cli([*args, f"ckpt_path={last}"], where)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run / "metrics.json").read_text())["finished"] is True
    (straight_run,) = run_dirs(tmp_path / "straight")
    a, b = _weights(straight_run / "checkpoints" / "last.ckpt"), _weights(last)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_ctrl_c_stops_with_130_and_names_the_last_checkpoint(tmp_path):
    """Ctrl-C lands anywhere (inside an optimizer step too), so nothing is saved then: the
    line names the last checkpoint written before it, the validation's at update 10."""
    stopped = cli([*cli_overrides(tmp_path), *RUN, *_signal_at(11, "SIGINT")], tmp_path)
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    (line,) = _error_lines(stopped.stderr)
    assert line == (
        "error: SIGINT stopped the run while training, at update 11; resume with "
        f"ckpt_path={last} (update 10)"
    )
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["finished"], metrics["stopped_by"], metrics["updates"]) == (False, "SIGINT", 11)


@pytest.mark.slow
def test_a_sigint_before_any_checkpoint_says_to_start_again(tmp_path):
    """Ctrl-C saves nothing (SIGTERM saves the update it stopped at): before the first
    checkpoint there is nothing to resume from."""
    stopped = cli([*cli_overrides(tmp_path), *RUN, *_signal_at(2, "SIGINT")], tmp_path)
    assert stopped.returncode == 128 + signal.SIGINT
    (line,) = _error_lines(stopped.stderr)
    assert line.endswith("at update 2; no checkpoint was written yet: start it again")


@pytest.mark.slow
def test_a_sigterm_names_the_last_checkpoint_where_the_callback_keeps_it(tmp_path):
    """callbacks.last_checkpoint.dirpath outside the run (a directory of its own): the line
    and metrics.json name the last.ckpt written there, not the run's checkpoints/."""
    elsewhere = tmp_path / "elsewhere"
    args = [*cli_overrides(tmp_path), *RUN, f"callbacks.last_checkpoint.dirpath={elsewhere}"]
    stopped = cli([*args, *_signal_at(5, "SIGTERM")], tmp_path)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    last = elsewhere / "last.ckpt"
    assert _error_lines(stopped.stderr) == [
        f"error: SIGTERM stopped the run while training, at update 6; resume with "
        f"ckpt_path={last} (update 6)"
    ]
    (run,) = run_dirs(tmp_path)
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["last_checkpoint"], metrics["last_checkpoint_update"]) == (str(last), 6)


@pytest.mark.slow
def test_a_sigterm_in_a_multirun_job_ends_the_sweep_naming_the_jobs_not_run(tmp_path, monkeypatch):
    """Three jobs, SIGTERM in job 1 at update 6: the sweep ends there with 143 and one line
    naming job 2 as not run; job 1's metrics.json is marked unfinished (the sweep report says
    so) and its last.ckpt holds update 6. The relaunch with resume_sweep keeps job 0,
    resumes job 1 and runs job 2."""
    grid = [*RUN, "seed=1,2,3", "+callbacks.kill._target_=tests.training.callbacks.KillJobAtStep"]
    grid += ["+callbacks.kill.step=5", "+callbacks.kill.signal=SIGTERM"]
    monkeypatch.setenv("AIAYN_TEST_KILL_JOB", "1")
    stopped = cli(["-m", *cli_overrides(tmp_path), *grid], tmp_path, timeout=900)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    (sweep,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    lines = _error_lines(stopped.stderr)
    assert lines[0].startswith("error: job 1 (model=tiny ") and " seed=2 " in lines[0]
    assert lines[0].endswith(
        "): SIGTERM stopped the run while training, at update 6; resume with "
        f"ckpt_path={sweep / '1' / 'checkpoints' / 'last.ckpt'} (update 6)"
    )
    assert lines[-1] == (
        "error: the sweep stopped in job 1; jobs 2 to 2 of 0 to 2 did not run; relaunch it "
        f"with its overrides and resume_sweep={sweep}: the stopped job resumes from its "
        "last.ckpt and the others run"
    )
    assert not (sweep / "2").exists()
    metrics = json.loads((sweep / "1" / "metrics.json").read_text())
    assert metrics["finished"] is False and metrics["updates"] == 6
    rows = {row["job"]: row["status"] for row in collect(sweep)}
    assert rows == {"0": "done", "1": "stopped by SIGTERM while training at update 6"}

    monkeypatch.delenv("AIAYN_TEST_KILL_JOB")
    relaunch = cli(
        ["-m", *cli_overrides(tmp_path), *grid, f"resume_sweep={sweep}"], tmp_path, timeout=900
    )
    assert relaunch.returncode == 0, relaunch.stderr[-3000:]
    for job in ("0", "1", "2"):
        assert json.loads((sweep / job / "metrics.json").read_text())["finished"] is True
    resumed = json.loads((sweep / "1" / "metrics.json").read_text())
    assert resumed["resumed_from"] == str(sweep / "1" / "checkpoints" / "last.ckpt")
