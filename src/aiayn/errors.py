"""One base error for every mistake a user can make, and the one place that turns it into a
line on stderr.

Every command-line tool (`train.py`, `evaluate.py`, `translate.py` and each `python -m aiayn.…`
tool) wraps its work in `exit_on_error`: an `AiaynError` becomes `error: <message>` on stderr
and exit code 1, never a traceback. Set `HYDRA_FULL_ERROR=1` to see the traceback anyway.
Anything else (a bug) still raises with its traceback.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
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
    """Another process of a multi-process run died."""


class StorageError(AiaynError):
    """A file could not be written: the disk (or the user's quota) is full."""


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


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
    except OSError as error:
        if error.errno not in NO_SPACE:
            raise
        where = Path(path)
        probe = next((p for p in (where, *where.parents) if p.exists()), Path("/"))
        free = shutil.disk_usage(probe).free
        need = f", about {_size(needed)} needed" if needed else ""
        raise StorageError(
            f"no space left writing {where} ({_size(free)} free{need}){kept}: free some space, "
            "or point paths.log_dir / data.cache_dir / output elsewhere, and run again"
        ) from None


def replace_text(path: str | os.PathLike, text: str) -> None:
    """Write `path` through `.<name>.tmp` beside it and a rename: readers (and a process
    killed mid-write) see the old text or the new, never part of it; a full disk is one
    `StorageError` and leaves the old text."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with writing(path, len(text.encode())):
            tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def exit_on_error(function: F) -> F:
    """Run `function`; an `AiaynError` prints `error: <message>` to stderr and exits 1."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except AiaynError as error:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            print(f"error: {error}", file=sys.stderr, flush=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]
