"""The data pipeline: corpus sources, BPE tokenizers, the prepared cache and token-budget
batches. `read_split(cfg, role)` reads one split of the configured corpus as text."""

from aiayn.data.sources import read_split

__all__ = ["read_split"]
