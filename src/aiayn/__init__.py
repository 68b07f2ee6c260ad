"""aiayn: the encoder-decoder Transformer of "Attention Is All You Need", trained with
PyTorch Lightning and configured with Hydra."""

__version__ = "0.1.0"
