"""Inference without Lightning: load a checkpoint file into a `Translator`, translate, score,
average checkpoints, draw attention. Nothing here imports the LightningModule."""

from aiayn.inference.checkpoint import load_checkpoint, read_checkpoint, save_atomically
from aiayn.inference.translator import LongLineError, Translator, decode_config

__all__ = [
    "LongLineError",
    "Translator",
    "decode_config",
    "load_checkpoint",
    "read_checkpoint",
    "save_atomically",
]
