"""Lightning callbacks of a training run. `conf/callbacks/*.yaml` instantiate them by these
names (`aiayn.callbacks.<Name>`); `RNGState` and `Throughput` are added to every run."""

from aiayn.callbacks.attention import AttentionMaps
from aiayn.callbacks.averaging import AverageCheckpoints
from aiayn.callbacks.ema import EMA
from aiayn.callbacks.last_checkpoint import LastCheckpoint
from aiayn.callbacks.rng import RNGState
from aiayn.callbacks.samples import SampleTranslations
from aiayn.callbacks.throughput import Throughput

__all__ = [
    "EMA",
    "AttentionMaps",
    "AverageCheckpoints",
    "LastCheckpoint",
    "RNGState",
    "SampleTranslations",
    "Throughput",
]
