"""The catalogue, part four: a run directory belongs to one run, a multirun directory to one
sweep (`aiayn.ownership`). A command pointed at a directory that holds a run, or lies inside
one, is refused in one line before Hydra writes anything there; a second process on a live
run or sweep is refused by a lock that a crashed holder does not leave behind; a relaunch
whose `multirun.yaml` cannot be read is refused, not warned about. Each case checks the exit
code, the one line, and every file's bytes before and after."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiayn import ownership
from tests.helpers import REPO, cli, cli_overrides, compose_with_hydra
from tests.reliability.test_user_files import fingerprint

SWEEP = ["sweep=heads"]
COMMANDS = {  # command: (its config, what it needs besides hydra.run.dir)
    "train": ("train", ["model=tiny"]),
    "evaluate": ("eval", ["ckpt_path={ckpt}"]),
    "translate": ("translate", ["ckpt_path={ckpt}", "input={input}"]),
    "visualize": ("visualize", ["ckpt_path={ckpt}"]),
    "prepare": ("prepare", []),
}


@pytest.fixture
def run(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of the shared finished run, to point commands at."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return copy


def _on_run_start(name: str, overrides: list[str], capsys) -> tuple[int, str]:
    """The command's Hydra callback as the entry point runs it: (exit code, stderr)."""
    with pytest.raises(SystemExit) as stopped:
        ownership.OwnDirectory().on_run_start(compose_with_hydra(name, overrides))
    return stopped.value.code, capsys.readouterr().err


def _filled(args: list[str], run: Path, tmp_path: Path) -> list[str]:
    source = tmp_path / "in.txt"
    source.write_text("a dog runs .\n")
    ckpt = run / "checkpoints" / "last.ckpt"
    return [a.format(ckpt=ckpt, input=source) for a in args]


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("where", ["the run", "inside it", "its checkpoints"])
def test_a_directory_holding_a_run_is_refused_to_every_command(
    command, where, run, tmp_path, capsys
):
    name, args = COMMANDS[command]
    target = {"the run": run, "inside it": run / "eval", "its checkpoints": run / "checkpoints"}
    before = fingerprint(run)
    code, err = _on_run_start(
        name, [*_filled(args, run, tmp_path), f"hydra.run.dir={target[where]}"], capsys
    )
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: hydra.run.dir={target[where]} holds a run already")
    assert "leave hydra.run.dir out" in line
    assert (" (inside the run " in line) == (where != "the run")
    if command == "train" and where == "the run":
        assert f"continue it with ckpt_path={run / 'checkpoints' / 'last.ckpt'}" in line
    assert fingerprint(run) == before
    assert not (run / "eval").exists()


@pytest.mark.parametrize("what", ["metrics.json", "checkpoints", ".hydra/config.yaml"])
def test_any_record_of_a_run_makes_it_one(what, tmp_path, capsys):
    """A directory holding only the metrics, only checkpoints or only Hydra's record (a run
    stopped early, or one whose other files were cleaned away) is a run too."""
    old = tmp_path / "old"
    (old / Path(what).parent).mkdir(parents=True, exist_ok=True)
    if what == "checkpoints":
        (old / what).mkdir()
        (old / what / "last.ckpt").write_bytes(b"weights")
    else:
        (old / what).write_text("{}\n")
    before = fingerprint(old)
    code, err = _on_run_start("train", ["model=tiny", f"hydra.run.dir={old}"], capsys)
    assert code == 1 and "holds a run already" in err
    assert fingerprint(old) == before


def test_an_empty_or_unrelated_directory_is_taken(tmp_path, capsys):
    for directory in (tmp_path / "new", tmp_path / "notes"):
        directory.mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("mine\n")
    ownership.check_run_dir(
        compose_with_hydra("train", [f"hydra.run.dir={tmp_path / 'notes'}"])
    )  # no error: it holds no run
    assert (tmp_path / "notes" / "readme.txt").read_text() == "mine\n"


def test_training_resumed_in_place_continues_its_own_run(run, capsys):
    last = run / "checkpoints" / "last.ckpt"
    config = compose_with_hydra("train", ["model=tiny", f"ckpt_path={last}"])
    assert Path(ownership.check_run_dir(config)).resolve() == run.resolve()
    other = compose_with_hydra("train", ["model=tiny", f"ckpt_path={last}", "train=false"])
    assert Path(ownership.check_run_dir(other)).resolve() != run.resolve()  # a test: new dir


def _holder(directory: Path, what: str) -> subprocess.Popen:
    """Another process that holds `directory`'s lock until killed."""
    code = (
        "import sys, time; from pathlib import Path; from aiayn.ownership import lock; "
        f"lock(Path({str(directory)!r}), {what!r}); print('held', flush=True); time.sleep(600)"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    )
    assert holder.stdout.readline() == "held\n"
    return holder


@pytest.mark.slow
def test_a_second_process_on_a_live_run_is_refused_and_a_dead_holder_leaves_no_lock(run, tmp_path):
    """A resume of a run that another process runs is refused in one line naming it (pid and
    host), with nothing written; once that process is SIGKILLed, the lock is gone with it and
    the run can be taken again."""
    holder = _holder(run, "run")
    last = run / "checkpoints" / "last.ckpt"
    args = [*cli_overrides(tmp_path), f"ckpt_path={last}", "trainer.max_steps=42", "test=false"]
    before = fingerprint(run)
    try:
        refused = cli(args, tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert refused.returncode == 1
    (line,) = [x for x in refused.stderr.splitlines() if x.startswith("error:")]
    assert line == (
        f"error: {run} is in use by pid {holder.pid} on {os.uname().nodename} since "
        f"{line.split(' since ')[1].split(';')[0]}; wait for that process to end (or stop it) "
        "before starting another on this run"
    )
    assert "Traceback" not in refused.stderr
    assert fingerprint(run) == before
    ownership.lock(run, "run")  # the holder died, and its lock with it


def test_the_lock_names_its_holder_in_the_file(tmp_path):
    ownership.lock(tmp_path, "run")
    text = (tmp_path / ownership.LOCK).read_text()
    assert text.startswith(f"pid {os.getpid()} on {os.uname().nodename} since ")
    ownership.lock(tmp_path, "run")  # this process again: already held
    holder_code = "from pathlib import Path; from aiayn.ownership import lock; "
    holder_code += f"lock(Path({str(tmp_path)!r}), 'sweep')"
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    other = subprocess.run(
        [sys.executable, "-c", holder_code], capture_output=True, text=True, env=env
    )
    assert other.returncode == 1 and f"is in use by pid {os.getpid()}" in other.stderr


def _sweep(tmp_path: Path) -> Path:
    """A multirun directory as a finished two-job sweep (`sweep=heads`) leaves it."""
    from omegaconf import OmegaConf

    sweep = tmp_path / "sweep"
    for job in ("0", "1"):
        (sweep / job / ".hydra").mkdir(parents=True)
        (sweep / job / ".hydra" / "config.yaml").write_text("seed: 1\n")
        (sweep / job / "metrics.json").write_text("{}\n")
    OmegaConf.save(compose_with_hydra("train", SWEEP), sweep / "multirun.yaml")
    return sweep


def _on_multirun_start(overrides: list[str], capsys) -> tuple[int, str]:
    from aiayn.training.sweep_resume import ResumeSweep

    config = compose_with_hydra("train", overrides)
    with pytest.raises(SystemExit) as stopped:
        ResumeSweep().on_multirun_start(config)  # in conf/hydra/default.yaml's order
        ownership.OwnDirectory().on_multirun_start(config)
    return stopped.value.code, capsys.readouterr().err


def test_an_existing_sweep_directory_without_resume_sweep_is_refused(tmp_path, capsys):
    sweep = _sweep(tmp_path)
    before = fingerprint(sweep)
    code, err = _on_multirun_start(["seed=1", f"hydra.sweep.dir={sweep}"], capsys)
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: hydra.sweep.dir={sweep} holds a sweep already")
    assert f"relaunch that sweep with resume_sweep={sweep}" in line
    assert fingerprint(sweep) == before


def test_a_sweep_directory_inside_a_run_is_refused(run, capsys):
    before = fingerprint(run)
    code, err = _on_multirun_start(["seed=1", f"hydra.sweep.dir={run / 'sweep'}"], capsys)
    assert code == 1 and f"lies inside the run {run.resolve()}" in err
    assert fingerprint(run) == before


@pytest.mark.parametrize(
    "damage",
    [
        "hydra: [unclosed\n",  # not YAML
        "- a list\n- not a mapping\n",
        "hydra:\n  overrides:\n    task: ['seed=[1,']\n  sweeper:\n    params: null\n",
        "",  # empty
        "\x00\x01binary",
    ],
    ids=["yaml", "list", "override grammar", "empty", "binary"],
)
def test_a_relaunch_whose_multirun_yaml_cannot_be_read_is_refused(damage, tmp_path, capsys):
    """Hydra turns a callback's exception into a warning and goes on: the relaunch would
    train an edited grid into the old sweep. It is refused in one line instead."""
    sweep = _sweep(tmp_path)
    (sweep / "multirun.yaml").write_text(damage)
    before = fingerprint(sweep)
    code, err = _on_multirun_start([*SWEEP, f"resume_sweep={sweep}"], capsys)
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: resume_sweep={sweep}: its multirun.yaml cannot be read (")
    assert "restore the file, or start a new sweep without resume_sweep" in line
    assert fingerprint(sweep) == before


def test_two_relaunches_of_one_sweep_at_once_the_second_is_refused(tmp_path, capsys):
    sweep = _sweep(tmp_path)
    holder = _holder(sweep, "sweep")
    before = fingerprint(sweep)
    try:
        code, err = _on_multirun_start([*SWEEP, f"resume_sweep={sweep}"], capsys)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert code == 1
    assert f"error: {sweep} is in use by pid {holder.pid}" in err
    assert "before starting another on this sweep" in err
    assert fingerprint(sweep) == before
    time.sleep(0.1)
    ownership.OwnDirectory().on_multirun_start(
        compose_with_hydra("train", [*SWEEP, f"resume_sweep={sweep}"])
    )  # the holder is gone: this one takes the sweep


@pytest.mark.slow
def test_a_refused_train_on_the_command_line_is_one_line_and_writes_nothing(run, tmp_path):
    """The real entry point: `python train.py hydra.run.dir=<a finished run>`."""
    before = fingerprint(run)
    result = cli([*cli_overrides(tmp_path), f"hydra.run.dir={run}"], tmp_path)
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: hydra.run.dir={run} holds a run already")
    )
    assert "Traceback" not in result.stderr
    assert fingerprint(run) == before
