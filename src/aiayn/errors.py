"""One base error for every mistake a user can make, and the one place that turns it into a
line on stderr.

Every command-line tool (`train.py`, `evaluate.py`, `translate.py` and each `python -m aiayn.…`
tool) wraps its work in `exit_on_error`: an `AiaynError` becomes `error: <message>` on stderr
and exit code 1, never a traceback. Set `HYDRA_FULL_ERROR=1` to see the traceback anyway.
Anything else (a bug) still raises with its traceback.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
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
