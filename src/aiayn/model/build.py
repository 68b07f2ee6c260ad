"""`build_model`: the model a `ModelConfig` describes (`arch`: Transformer or the LSTM
baseline). Both have the same interface, so everything downstream takes a `Model`."""

from __future__ import annotations

from aiayn.model.cache import KVCache
from aiayn.model.config import ModelConfig
from aiayn.model.rnn import AttentionLSTM, RNNCache
from aiayn.model.transformer import Transformer

Model = Transformer | AttentionLSTM
Cache = KVCache | RNNCache  # what their init_cache returns


def build_model(config: ModelConfig) -> Model:
    """A freshly initialised `Transformer` (``arch='transformer'``) or `AttentionLSTM`."""
    return AttentionLSTM(config) if config.arch == "rnn" else Transformer(config)
