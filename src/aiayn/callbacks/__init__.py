"""Lightning callbacks of a training run. `conf/callbacks/*.yaml` instantiate them by these
names (`aiayn.callbacks.<Name>`); `RNGState`, `Throughput`, `SigtermAtLogSteps` and
`PeerWatch` are added to every run, and `SyncedTimer` takes the place of the Timer that
`trainer.max_time` gives."""

from aiayn.callbacks.attention import AttentionMaps
from aiayn.callbacks.averaging import AverageCheckpoints
from aiayn.callbacks.ema import EMA
from aiayn.callbacks.last_checkpoint import LastCheckpoint
from aiayn.callbacks.peers import PeerWatch
from aiayn.callbacks.rng import RNGState
from aiayn.callbacks.samples import SampleTranslations
from aiayn.callbacks.sigterm import SigtermAtLogSteps
from aiayn.callbacks.throughput import Throughput
from aiayn.callbacks.timer import SyncedTimer

__all__ = [
    "EMA",
    "AttentionMaps",
    "AverageCheckpoints",
    "LastCheckpoint",
    "PeerWatch",
    "RNGState",
    "SampleTranslations",
    "SigtermAtLogSteps",
    "SyncedTimer",
    "Throughput",
]
