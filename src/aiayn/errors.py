"""One base error for every mistake a user can make, and the one place that turns it into a
line on stderr.

Every command-line tool (`train.py`, `evaluate.py`, `translate.py` and each `python -m aiayn.…`
tool) wraps its work in `exit_on_error`: an `AiaynError` becomes `error: <message>` on stderr
and exit code 1, never a traceback. Set `HYDRA_FULL_ERROR=1` to see the traceback anyway.
Anything else (a bug) still raises with its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import re
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class AiaynError(ValueError):
    """A user's mistake (config, data, checkpoint, input); the message names the key, file or
    line and says what to do."""


class ConfigError(AiaynError):
    """A composed config that cannot run."""


class DataError(AiaynError):
    """The corpus, a tokenizer file or the cache cannot be used as given."""


class CheckpointError(AiaynError):
    """A checkpoint that is missing, unreadable, or does not fit its tokenizer."""


class TranslationError(AiaynError):
    """An input that cannot be translated (file, line, encoding, length)."""


class AveragingError(AiaynError):
    """Checkpoints that cannot be averaged."""


class DivergedError(AiaynError):
    """Training produced non-finite gradients too many updates in a row."""


class DistributedError(AiaynError):
    """Another process of a multi-process run died. `quiet`: another process prints the
    line, this one only exits 1 (one line for the whole run)."""

    quiet = False


class OutputError(AiaynError):
    """An output that would overwrite an input or a file the command does not own
    (`aiayn.outputs.check_output`)."""


class StoppedError(AiaynError):
    """A run stopped by a signal (SIGTERM: a preemption or `scancel`; SIGINT: Ctrl-C): its
    command exits with `exit_code`, 128 + the signal's number, as a shell reports it.
    `quiet` on every rank but 0 (one line for the run); `ends_sweep`: in a multirun job, the
    line that ends the sweep (`SweepStopped`)."""

    quiet = False
    ends_sweep = ""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@contextmanager
def stopped_by_sigterm(what: str) -> Iterator[None]:
    """Within the block a SIGTERM raises `StoppedError` (exit 143) instead of ending the
    process on the spot, so that the block's cleanup runs (an export's staging directory is
    removed) and the command says what stopped. The handler before is restored after."""

    def stop(signum: int, frame: object) -> None:
        raise StoppedError(f"SIGTERM stopped {what}; nothing of it was kept: run it again", 143)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class SweepStopped(BaseException):
    """A signal stopped a multirun's job: the sweep ends there, with the job's exit code;
    the message says which jobs did not run and how to relaunch. A BaseException, so that
    Hydra's launcher does not record it as one failed job and go on to the next."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class StorageError(AiaynError):
    """A file could not be written: the disk (or the user's quota) is full."""


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# how torch.save's zip writer reports a write that failed (ENOSPC included)
TORCH_WRITE_FAILED = ("unexpected pos", "file write failed")


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


@contextmanager
def writing(path: str | os.PathLike, needed: int | None = None, kept: str = "") -> Iterator[None]:
    """Turn a full disk (or quota) while writing `path` into one `StorageError` naming the
    path, the free space, the space `needed` (bytes, where known) and what was `kept`."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        where = Path(path)
        probe = next((p for p in (where, *where.parents) if p.exists()), Path("/"))
        free = shutil.disk_usage(probe).free
        if not _no_space(error, free, needed):
            raise
        need = f", about {_size(needed)} needed" if needed else ""
        if where.exists() and not where.is_file() and not where.is_dir():  # e.g. /dev/full
            raise StorageError(
                f"{where} refused the write (no space on that device): name a file to write "
                "instead, and run again"
            ) from None
        raise StorageError(
            f"no space left writing {where} ({_size(free)} free{need}){kept}: free some space, "
            "or point paths.log_dir / data.cache_dir / output elsewhere, and run again"
        ) from None


def _no_space(error: OSError | RuntimeError, free: int, needed: int | None) -> bool:
    """Whether `error` is a full disk: ENOSPC/EDQUOT, or the RuntimeError torch's zip writer
    turns a failed write into (it keeps no errno) where the disk has less free than needed
    (or almost nothing)."""
    if isinstance(error, OSError):
        return error.errno in NO_SPACE
    failed_write = any(m in str(error) for m in TORCH_WRITE_FAILED)
    return failed_write and free < max(needed or 0, 1 << 20)


def replace_text(path: str | os.PathLike, text: str) -> None:
    """Write `path` through `.<name>.<pid>.tmp` beside it and a rename: readers (and a process
    killed mid-write) see the old text or the new, never part of it, also while several
    processes write it at once (each through its own file; the last rename wins); a full disk
    is one `StorageError` and leaves the old text."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with writing(path, len(text.encode())):
            tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


# the run directories this process created (`aiayn.config.new_run_dir`)
CLAIMED_RUN_DIRS: list[str] = []
# what Hydra writes into a run directory before the command does anything
HYDRA_ONLY = re.compile(r"\.hydra|\w+\.log|\.aiayn\.lock")
# the jobs of this process's Hydra multirun that failed with an AiaynError: (job, message)
FAILED_JOBS: list[tuple[str, str]] = []
FAILED_FILE = "FAILED"  # written into a failed job's directory, with its error


def exit_in_hydra(check: Callable[[], Any]) -> None:
    """Run `check` inside Hydra's own machinery (a callback, an interpolation Hydra resolves
    for its directories), where Hydra would turn an exception into a warning and go on, or
    into a traceback: an `AiaynError` prints its one line and ends the command here, exit 1."""
    try:
        check()
    except AiaynError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            logging.shutdown()
        sys.exit(1)


def exit_on_error(function: F) -> F:
    """Run `function`; an `AiaynError` prints `error: <message>` to stderr and exits 1. In a
    Hydra multirun job it ends that job only: the error goes to stderr, to `FAILED` in the
    job's directory and to `FAILED_JOBS`, and the sweep goes on (`exit_if_jobs_failed` ends
    the command non-zero once every job has run)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except AiaynError as error:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            job = _multirun_job()
            code = getattr(error, "exit_code", 1)
            if job is None:
                if not getattr(error, "quiet", False):
                    print(f"error: {error}", file=sys.stderr, flush=True)
                _discard_empty_run_dirs()
                sys.exit(code)
            name, directory = job
            if not getattr(error, "quiet", False):
                print(f"error: job {name}: {error}", file=sys.stderr, flush=True)
            FAILED_JOBS.append((name, str(error)))
            with contextlib.suppress(OSError):
                Path(directory, FAILED_FILE).write_text(f"{error}\n", encoding="utf-8")
            if isinstance(error, StoppedError) and error.ends_sweep:
                raise SweepStopped(error.ends_sweep, code) from None
            return float("nan")  # a sweeper's objective: optuna counts the trial as failed

    return wrapper  # type: ignore[return-value]


def _discard_empty_run_dirs() -> None:
    """Remove the run directories this process created that hold nothing but what Hydra
    wrote (a refused command leaves no stray run behind)."""
    for directory in map(Path, CLAIMED_RUN_DIRS):
        with contextlib.suppress(OSError):
            if all(HYDRA_ONLY.fullmatch(entry.name) for entry in directory.iterdir()):
                shutil.rmtree(directory)


def _multirun_job() -> tuple[str, str] | None:
    """(`<num> (<overrides>)`, its output directory) of the Hydra multirun job this process
    runs, else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hydra = HydraConfig.get()
    if hydra.mode != RunMode.MULTIRUN:
        return None
    return f"{hydra.job.num} ({' '.join(hydra.overrides.task)})", hydra.runtime.output_dir


def exit_if_jobs_failed() -> None:
    """After a multirun: list the jobs that failed and exit 1, if any did."""
    if FAILED_JOBS:
        lines = "\n".join(f"  job {name}: {message}" for name, message in FAILED_JOBS)
        print(f"error: {len(FAILED_JOBS)} job(s) failed:\n{lines}", file=sys.stderr, flush=True)
        sys.exit(1)
