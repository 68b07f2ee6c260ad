"""A run's `metrics.json`: written when the run ends, or, marked `finished: false`, when a
signal stopped it (`aiayn.training.run`: where it stopped and the checkpoint to resume from).
Runs written before the mark existed all finished."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_metrics(run: Path) -> dict[str, Any] | None:
    """`run/metrics.json`, else None (a run that failed, or runs still)."""
    path = run / "metrics.json"
    return json.loads(path.read_text()) if path.is_file() else None


def finished(metrics: dict[str, Any] | None) -> bool:
    """Whether `metrics` (of `read_metrics`) are those of a run that finished."""
    return metrics is not None and metrics.get("finished", True) is not False


def stopped_status(metrics: dict[str, Any]) -> str:
    """How an unfinished run's record reads in a report."""
    return (
        f"stopped by {metrics.get('stopped_by')} while {metrics.get('stopped_while')} at "
        f"update {metrics.get('updates')}"
    )
