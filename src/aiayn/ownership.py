"""A run directory belongs to one run, a multirun directory to one sweep.

Every command's Hydra config (conf/hydra/default.yaml) runs `OwnDirectory` before Hydra
creates its directory or writes `.hydra/` there:

- a directory that already holds a run (its `.hydra/config.yaml`, `checkpoints/` or
  `metrics.json`), or lies inside one, is refused in one line: a new run would write over
  that run's checkpoints, metrics and record. The one exception is training resumed in place
  (`ckpt_path=<run>/checkpoints/<x>.ckpt`), which continues that very run.
- the process then holds an exclusive lock on the directory (`.aiayn.lock`, `flock`) for the
  rest of its life, so a second process on a live run (two resumes of one run, two relaunches
  of one sweep) is refused in one line naming the holder. The kernel drops the lock when its
  holder ends, crashed or not, so a lock is never stale.

Only the first process of a launch checks and locks: the other ranks of torchrun or srun, and
the processes Lightning's own launcher starts, join the directory rank 0 claimed.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import logging
import os
import socket
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from aiayn.errors import ConfigError, exit_in_hydra
from aiayn.launchers import external_launch, started_by_lightning
from aiayn.outputs import check_output_dir, run_around

log = logging.getLogger(__name__)

LOCK = ".aiayn.lock"
_HELD: dict[str, int] = {}  # lock path -> descriptor, open (and locked) until the process ends


def holds_run(directory: Path) -> Path | None:
    """The run `directory` holds or lies inside (a directory with `.hydra/config.yaml`,
    `checkpoints/` or `metrics.json`), else None."""
    directory = directory.resolve()
    if any((directory / name).exists() for name in ("checkpoints", "metrics.json")):
        return directory
    return run_around(directory)


def lock(directory: Path, what: str) -> None:
    """Hold `directory`'s lock for the rest of this process, else `ConfigError` naming the
    process that holds it. `what`: "run" or "sweep", for the message."""
    path = directory / LOCK
    key = str(path.resolve())
    if key in _HELD:
        return
    directory.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        holder = Path(path).read_text(errors="replace").strip() or "another process"
        os.close(descriptor)
        if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):  # no locks here (Lustre)
            log.warning("cannot lock %s (%s): a second process is not refused", path, error)
            return
        raise ConfigError(
            f"{directory} is in use by {holder}; wait for that process to end (or stop it) "
            f"before starting another on this {what}"
        ) from None
    started = datetime.datetime.now().isoformat(timespec="seconds")
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"pid {os.getpid()} on {socket.gethostname()} since {started}\n".encode())
    _HELD[key] = descriptor


def _first_process() -> bool:
    """Whether this process claims (checks, locks) the directory of its launch."""
    launch = external_launch()
    if launch is not None:
        return launch.rank == 0
    return not started_by_lightning()


def check_run_dir(config: DictConfig) -> Path:
    """`hydra.run.dir` of `config`, refused where it holds another run (see the module)."""
    directory = check_output_dir(str(OmegaConf.select(config, "hydra.run.dir")), "hydra.run.dir")
    run = holds_run(directory)
    if run is None or _resumes(config, run):
        return directory
    hint = "leave hydra.run.dir out (each run gets a new directory) or choose a new one"
    training = OmegaConf.select(config, "train", default=None) is not None
    if training and run_around(run) == run:  # a run's record: it may be continued
        last = run / "checkpoints" / "last.ckpt"
        hint = f"continue it with ckpt_path={last}, or {hint}" if last.is_file() else hint
    inside = "" if run == directory.resolve() else f" (inside the run {run})"
    raise ConfigError(
        f"hydra.run.dir={directory} holds a run already{inside}: a new run there would "
        f"write over its checkpoints and records; {hint}"
    )


def check_sweep_dir(config: DictConfig) -> Path:
    """`hydra.sweep.dir` of `config`, refused where it holds a sweep already and this launch
    does not relaunch it (`resume_sweep`), or lies inside a run."""
    directory = check_output_dir(
        str(OmegaConf.select(config, "hydra.sweep.dir")), "hydra.sweep.dir"
    )
    relaunch = OmegaConf.select(config, "resume_sweep", default=None)
    if (directory / "multirun.yaml").is_file() and not relaunch:
        raise ConfigError(
            f"hydra.sweep.dir={directory} holds a sweep already: its jobs would be written "
            f"over; relaunch that sweep with resume_sweep={directory} (the same overrides), "
            "or leave hydra.sweep.dir out for a new one"
        )
    run = run_around(directory)
    if run is not None:
        raise ConfigError(
            f"hydra.sweep.dir={directory} lies inside the run {run}: choose a directory of "
            "its own, or leave hydra.sweep.dir out"
        )
    return directory


# the keys where a training run's callbacks and loggers write: directories, and files
WRITER_DIRS, WRITER_FILES = ("dirpath", "save_dir"), ("path",)
# writers that put each run in a new directory of its own under theirs (W&B's run-<id>/), so
# a directory they share with earlier runs is theirs to share
OWN_SUBDIRS = ("WandbLogger",)


def _writers(config: DictConfig) -> list[tuple[str, Path, bool, bool]]:
    """(`group.name.key=value`, the resolved path, whether it is a directory, whether the
    writer makes a directory of its own in it) of each path a training run's callbacks and
    loggers write to."""
    found = []
    for group in ("callbacks", "logger"):
        for name, node in (OmegaConf.select(config, group) or {}).items():
            own = str((node or {}).get("_target_", "")).endswith(OWN_SUBDIRS)
            for key in (*WRITER_DIRS, *WRITER_FILES) if node else ():
                value = OmegaConf.select(node, key, default=None)
                if value is not None:
                    where = f"{group}.{name}.{key}={value}"
                    path = Path(str(value)).resolve()
                    found.append((where, path, key in WRITER_DIRS, own))
    return found


def check_writers(config: DictConfig, run: Path, resuming: bool) -> None:
    """Every callback and logger of a training run writes inside `run`, or into a directory
    of its own: a path that lies in another run is refused, and outside any run a directory
    that holds files already (a file that exists, for a file's path) unless the run resumes,
    so that no writer replaces another run's records or a user's files. Checked by the first
    process of a launch, as the run directory is: the others start once it may have written
    there."""
    if not _first_process():
        return
    run = run.resolve()
    for where, path, is_dir, own in _writers(config):
        if path == run or run in path.parents:
            continue
        key = where.split("=", 1)[0]
        other = run_around(path if is_dir else path.parent)
        if other is not None:
            raise ConfigError(
                f"{where} lies in the run {other}: it would write over that run's records; "
                f"leave {key} at its default (inside this run) or choose a directory of its own"
            )
        taken = path.is_dir() and any(path.iterdir()) if is_dir else path.is_file()
        if taken and not resuming and not own:
            raise ConfigError(
                f"{where} holds files already: a new run would write over them; choose a new "
                f"or empty {'directory' if is_dir else 'file'}, or leave {key} at its default "
                "(inside this run)"
            )


def _resumes(config: DictConfig, run: Path) -> bool:
    """Training resumed in place: `ckpt_path` is a checkpoint of `run` itself."""
    ckpt = OmegaConf.select(config, "ckpt_path", default=None)
    if not ckpt or not OmegaConf.select(config, "train", default=False):
        return False
    path = Path(str(ckpt)).resolve()
    return path.parent.name == "checkpoints" and path.parent.parent == run


class OwnDirectory(Callback):
    """Hydra callback (conf/hydra/default.yaml): the run or multirun directory is this
    command's alone (module docstring); an error is one line and exit status 1."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if OmegaConf.select(config, "hydra.output_subdir") is None or not _first_process():
            return  # a process of a launch whose first process claims the directory
        exit_in_hydra(lambda: lock(check_run_dir(config), "run"))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not _first_process():
            return
        exit_in_hydra(lambda: lock(check_sweep_dir(config), "sweep"))
