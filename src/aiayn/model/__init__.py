"""The Transformer and its LSTM baseline in plain PyTorch (no Lightning, Hydra or tokenizers)."""

from aiayn.model.attention import capture_attention
from aiayn.model.build import Model, build_model
from aiayn.model.cache import KVCache
from aiayn.model.config import ModelConfig
from aiayn.model.generate import DecodeConfig, Hypothesis, generate
from aiayn.model.masks import attention_mask, causal_mask, padding_mask
from aiayn.model.rnn import AttentionLSTM, RNNCache
from aiayn.model.summary import format_parameter_summary, parameter_summary
from aiayn.model.transformer import Transformer

__all__ = [
    "AttentionLSTM",
    "DecodeConfig",
    "Hypothesis",
    "KVCache",
    "Model",
    "ModelConfig",
    "RNNCache",
    "Transformer",
    "attention_mask",
    "build_model",
    "capture_attention",
    "causal_mask",
    "format_parameter_summary",
    "generate",
    "padding_mask",
    "parameter_summary",
]
