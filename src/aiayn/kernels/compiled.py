"""`compile`: whether a run compiles its training step (`torch.compile` of
`TranslationModule._losses`: the model, the output layer and the loss, forward and backward,
as one graph; the fused Adam step is one kernel already and stays eager, and so does
decoding). ``compile=null`` (the default) resolves here by device: on where it was measured
to win, off where it was not (`COMPILE_WINS`, with the record that decided it)."""

from __future__ import annotations

from aiayn.errors import ConfigError

# device type -> whether compile=null compiles there, and why (the measurement that decided)
COMPILE_WINS = {
    # experiments/gpu_speed.md (H200): compiled, the base update at the paper's batch ran
    # half as fast again as the eager one, but compiling it took minutes (its graph for
    # batches of any shape), and a second graph for validation follows: more than a short run
    # gains, and not yet run through train.py on a GPU. Long runs set compile=true
    # (docs/gpus.md).
    "cuda": False,
    # the CPU kernels' products (aiayn.kernels.linear) read masks on the host: graph breaks,
    # and compiling takes minutes of a 2-core hour
    "cpu": False,
}


def resolve_compile(requested: bool | None, device_type: str, arch: str) -> bool:
    """`compile` made concrete for a run on `device_type` (``cuda``, ``cpu``, ...) of a model
    of `arch`; ConfigError for the LSTM baseline, whose packed sequences need their lengths
    on the host (no graph holds that)."""
    if arch != "transformer":
        if requested:
            raise ConfigError(
                f"compile=true compiles the Transformer's training step; model.arch={arch} "
                "packs its batches by lengths read on the host, which no compiled graph holds: "
                "set compile=false (or leave it unset)"
            )
        return False
    if requested is None:
        return COMPILE_WINS.get(device_type, False)
    return bool(requested)
