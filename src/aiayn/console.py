"""What a run prints: each message once, in Hydra's format (console and `<run>/train.log`),
without library noise a user cannot act on, progress bars on long work, and a closing summary
that says where everything is and how to use it."""

from __future__ import annotations

import logging
import shlex
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# Lightning adds its own console handler to these loggers when it is imported before Hydra
# configures logging, so every line came out twice (once per format).
LIBRARY_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")
# Not actionable for an aiayn user: Lightning's advertisement.
NOISE = ("💡 Tip:", "litlogger")


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(marker in message for marker in NOISE)


def tidy_library_output() -> None:
    """Route library loggers through Hydra's handlers only, and drop noise at the source."""
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropNoise) for f in rank_zero.filters):
        rank_zero.addFilter(_DropNoise())
    # Lightning's own use of a torch API it has not caught up with; nothing a user can change
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")


def closing_summary(metrics: dict[str, Any]) -> str:
    """The lines printed when a run ends: results, where the files are, what to run next."""
    run = Path(metrics["run_dir"])
    test = metrics.get("test") or {}
    best = metrics.get("test_checkpoint") or metrics.get("best_checkpoint")
    lines = ["", "=" * 72]
    results = [f"{k} = {v:.2f}" for k, v in sorted(test.items()) if isinstance(v, float)]
    if "best" in metrics:
        results += [f"best {k} = {v:.2f}" for k, v in metrics["best"].items()]
    if results:
        lines.append("result: " + ", ".join(results))
    lines.append(f"{'run directory:':<17}{run}")
    for label, path in (
        ("model (tested)", best),
        ("last checkpoint", metrics.get("last_checkpoint")),
        ("metrics", run / "metrics.json"),
        ("tokenizer", run / "tokenizer.json"),
        ("log", run / "train.log"),
    ):
        if path and Path(path).exists():
            lines.append(f"{label + ':':<17}{path}")
    wandb = sorted(run.glob("wandb/*run-*"))
    if wandb:
        lines.append(f"{'W&B run:':<17}{wandb[-1]}")
    if best:
        ckpt = shlex.quote(str(best))
        lines.append("next:")
        lines.append(f"  python evaluate.py ckpt_path={ckpt} decode=beam")
        lines.append(f"  python translate.py ckpt_path={ckpt} input=src.txt output=hyp.txt")
    lines.append("=" * 72)
    return "\n".join(lines)


# progress bars on/off for this process (train.py follows trainer.enable_progress_bar;
# evaluate/translate/prepare their `progress` key); drawn only on a terminal either way
_progress_enabled = True


def set_progress(enabled: bool) -> None:
    global _progress_enabled
    _progress_enabled = bool(enabled)


def progress_console() -> Console:
    """Where progress bars are drawn: standard error (standard output may carry
    translations), and only while standard output is a terminal too (a redirected run's
    output and logs stay clean)."""
    return Console(stderr=True, force_terminal=None if sys.stdout.isatty() else False)


Advance = Callable[[int], None]


class Stages:
    """Rich progress bars on standard error, one per stage (`stage(name, total)` returns
    `advance(n)`); silent when disabled or when standard output or error is not a terminal
    (logs, CI, pipes), so a redirected run's output stays clean."""

    def __init__(self, progress: Progress | None) -> None:
        self._progress = progress

    def stage(self, description: str, total: int | None = None) -> Advance:
        if self._progress is None:
            return lambda n: None
        task = self._progress.add_task(description, total=total)
        return lambda n: self._progress.advance(task, n)  # type: ignore[union-attr]


@contextmanager
def progress(enabled: bool | None = None) -> Iterator[Stages]:
    """`with progress() as bars: advance = bars.stage("encode", total=n)`; `enabled=None`
    follows `set_progress`."""
    console = progress_console()
    if not (_progress_enabled if enabled is None else enabled) or not console.is_terminal:
        yield Stages(None)
        return
    columns = (
        TextColumn("{task.description:<24}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as bar:
        yield Stages(bar)
