"""Parameter counts for the console and the loggers."""

from __future__ import annotations

from torch import nn


def parameter_summary(model: nn.Module) -> dict[str, int]:
    """``{'total', 'trainable', <each top-level submodule>: count}``.

    Shared (tied) parameters are counted once everywhere: in the totals, and under the first
    submodule (in registration order) that holds them, so the per-module counts add up to
    ``total`` plus any parameters registered directly on ``model``.
    """
    params = list(model.parameters())  # deduplicated by nn.Module
    summary = {
        "total": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
    }
    seen: set[int] = set()
    for name, child in model.named_children():
        fresh = [p for p in child.parameters() if id(p) not in seen]
        seen.update(id(p) for p in fresh)
        summary[name] = sum(p.numel() for p in fresh)
    return summary


def _human(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def format_parameter_summary(summary: dict[str, int]) -> str:
    """A small table: one row per module, then trainable and total."""
    total = max(summary.get("total", 0), 1)
    modules = [k for k in summary if k not in ("total", "trainable")]
    rows = [(k, summary[k]) for k in modules] + [
        ("trainable", summary.get("trainable", 0)),
        ("total", summary.get("total", 0)),
    ]
    width = max(len("module"), *(len(k) for k, _ in rows))
    lines = [f"{'module':<{width}}  {'params':>12}  {'':>7}  {'share':>6}"]
    lines.append("-" * len(lines[0]))
    for i, (name, n) in enumerate(rows):
        if i == len(modules):
            lines.append("-" * len(lines[0]))
        lines.append(f"{name:<{width}}  {n:>12,}  {_human(n):>7}  {100 * n / total:>5.1f}%")
    return "\n".join(lines)
