"""The Transformer model in plain PyTorch (no Lightning, Hydra or tokenizer imports)."""

from aiayn.model.attention import capture_attention
from aiayn.model.cache import KVCache
from aiayn.model.config import ModelConfig
from aiayn.model.generate import DecodeConfig, Hypothesis, generate
from aiayn.model.masks import attention_mask, causal_mask, padding_mask
from aiayn.model.summary import format_parameter_summary, parameter_summary
from aiayn.model.transformer import Transformer

__all__ = [
    "DecodeConfig",
    "Hypothesis",
    "KVCache",
    "ModelConfig",
    "Transformer",
    "attention_mask",
    "capture_attention",
    "causal_mask",
    "format_parameter_summary",
    "generate",
    "padding_mask",
    "parameter_summary",
]
