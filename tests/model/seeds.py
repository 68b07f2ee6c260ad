"""Run the seed notebooks' own model code (../shared/seeds/, never copied into aiayn) and copy
a seed model's weights into an aiayn `Transformer`."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

SEEDS = Path(__file__).resolve().parents[3] / "shared" / "seeds"


def seed_classes(number: str, fixes: dict[str, str] | None = None) -> dict[str, Any]:
    """The classes the seed notebook `number` ('003', ...) defines, executed as written (each
    `class` block up to the next line at column 0); skips the test without ../shared/seeds.
    `fixes` (old -> new text, each of which must occur) repair a notebook that does not run
    as written (seed 001)."""
    files = sorted(SEEDS.glob(f"{number}_*.txt"))
    if not files:
        pytest.skip(f"the seed notebooks are not here ({SEEDS}): the parity test needs them")
    blocks, current = [], None
    for line in files[0].read_text(encoding="utf-8").splitlines():
        if line.startswith("class "):
            current = [line]
            blocks.append(current)
        elif current is not None and (not line.strip() or line[0].isspace()):
            current.append(line)
        else:
            current = None
    # the names the notebooks import (their plotting imports are not needed)
    namespace: dict[str, Any] = {"torch": torch, "nn": nn, "F": F, "math": math}
    namespace["deepcopy"] = copy.deepcopy
    code = "\n".join("\n".join(b) for b in blocks)
    for old, new in (fixes or {}).items():
        assert old in code, f"{files[0].name} no longer contains {old!r}"
        code = code.replace(old, new)
    exec(compile(code, str(files[0]), "exec"), namespace)
    return namespace


def randomize_norms(model: nn.Module, seed: int = 0) -> None:
    """LayerNorm weights and biases away from (1, 0), so a misplaced norm shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.copy_(1 + 0.3 * torch.randn(module.weight.shape, generator=generator))
                module.bias.copy_(0.2 * torch.randn(module.bias.shape, generator=generator))


def copy_linear(dst: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    dst.weight.copy_(weight)
    if bias is not None:
        dst.bias.copy_(bias)


def copy_attention(dst: nn.Module, q: tuple, k: tuple, v: tuple, out: nn.Module) -> None:
    """(weight, bias) of the seed's q, k, v projections and its output Linear into aiayn's
    fused self- (`qkv_proj`) or cross-attention (`q_proj`, `kv_proj`)."""
    if hasattr(dst, "qkv_proj"):
        weight = torch.cat([q[0], k[0], v[0]])
        copy_linear(dst.qkv_proj, weight, torch.cat([q[1], k[1], v[1]]))
    else:
        copy_linear(dst.q_proj, *q)
        copy_linear(dst.kv_proj, torch.cat([k[0], v[0]]), torch.cat([k[1], v[1]]))
    copy_linear(dst.out_proj, out.weight, out.bias)


def linears(attention: nn.Module) -> tuple[tuple, tuple, tuple, nn.Module]:
    """q, k, v (weight, bias) and the output Linear of a seed attention module: separate
    W_q/W_k/W_v/W_o (seed 003), q/k/v/out_proj (seed 000) or nn.MultiheadAttention (004)."""
    if isinstance(attention, nn.MultiheadAttention):
        w, b = attention.in_proj_weight.chunk(3), attention.in_proj_bias.chunk(3)
        return (w[0], b[0]), (w[1], b[1]), (w[2], b[2]), attention.out_proj
    if hasattr(attention, "q_proj"):  # seed 000: q_proj, k_proj, v_proj, out_proj
        parts = [getattr(attention, f"{n}_proj") for n in "qkv"]
        q, k, v = ((p.weight, p.bias) for p in parts)
        return q, k, v, attention.out_proj
    parts = [getattr(attention, f"W_{n}") for n in "qkv"]
    q, k, v = ((p.weight, p.bias) for p in parts)
    return q, k, v, attention.W_o
