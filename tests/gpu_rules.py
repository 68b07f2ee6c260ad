"""What a CUDA run enforces, enforced on the CPU (no GPU in CI): `GpuRules`, a test-only
callback that a CPU run takes through its config (`+callbacks.gpu_rules._target_=...`).

On a GPU, a tensor made from host data without a device (`torch.tensor(x)`) is a CPU tensor
while the model's are CUDA tensors; on the CPU both are CPU tensors, so nothing tells them
apart. `HostTensors` does: a torch-function mode that marks every tensor a factory made
without a device (and whatever is computed from one) as a host tensor, until something moves it
to a device by name. Then:

- every collective (`torch.distributed.all_reduce`, `all_gather`, `broadcast`, ...) refuses a
  host tensor, as NCCL refuses a CPU tensor;
- `trainer.test` runs under `torch.inference_mode`, as Lightning runs it on GPUs (on gloo it
  falls back to `no_grad`; validation inside `fit` is under `no_grad` everywhere);
- every host-device synchronisation in the training steps is recorded with its place in the
  code: reading a device tensor (`.item()`, `bool()`, `float()`, `.tolist()`, `.cpu()`, ...)
  and a blocking copy of host data to the device (`torch.tensor(x, device=d)`,
  `.to(d)` without `non_blocking`). A step is everything from one training batch's start to
  the next one's;
- every collective called in a training step (`COLLECTIVES` and `OTHER_COLLECTIVES`: a
  barrier, a broadcast, an all-reduce, an object broadcast, ...) is recorded with its place in
  the code, except FSDP's own (its parameter all-gathers and gradient reduce-scatters, the
  sharded counterpart of DDP's gradient all-reduce, which DDP's reducer makes in C++ where no
  Python sees it);
- each step says whether it was a log step: one whose metrics Lightning writes (every
  `trainer.log_every_n_steps` updates, or the step a stop was asked at), where reading the
  device is expected; and the last step of the fit is marked as such.
"""

from __future__ import annotations

import contextlib
import json
import os
import traceback
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

HOST = "_aiayn_host_tensor"
FACTORIES = {
    torch.tensor,
    torch.as_tensor,
    torch.scalar_tensor,
    torch.zeros,
    torch.ones,
    torch.empty,
    torch.full,
    torch.arange,
    torch.linspace,
    torch.rand,
    torch.randn,
    torch.randint,
    torch.randperm,
}
INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}
READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__index__,
    torch.Tensor.numpy,
    torch.Tensor.cpu,
    torch.Tensor.nonzero,
    torch.nonzero,
    torch.Tensor.unique,
    torch.unique,
    torch.masked_select,
    torch.Tensor.masked_select,
}
MOVES = {torch.Tensor.to, torch.Tensor.cuda}
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "broadcast",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "gather",
    "scatter",
)
# collectives that take no tensors, or that are only counted: recorded, not checked for host
# tensors (an object collective pickles host objects, as it does on GPUs)
OTHER_COLLECTIVES = (
    "barrier",
    "monitored_barrier",
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
    "all_reduce_coalesced",
    "all_gather_coalesced",
    "all_to_all",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "_broadcast_coalesced",  # DDP's broadcast of the module's buffers before a forward
)


def is_host(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor) and getattr(tensor, HOST, False)


def _mark(result: Any, host: bool) -> Any:
    for leaf in tree_flatten(result)[0]:
        if isinstance(leaf, torch.Tensor):
            with contextlib.suppress(AttributeError, RuntimeError):  # some subclasses refuse
                setattr(leaf, HOST, host)
    return result


def _names_device(args: tuple, kwargs: dict) -> bool:
    if kwargs.get("device") is not None:
        return True
    return any(isinstance(a, (torch.device, str)) and a != "meta" for a in args[1:]) or any(
        isinstance(a, torch.Tensor) for a in args[1:]
    )


def _where() -> str | None:
    """file:line of the innermost frame in aiayn, Lightning or torchmetrics; None inside a
    DataLoader (its batches are made on the host: a GPU run reads no device there)."""
    stack = traceback.extract_stack()[:-3]
    if any("/torch/utils/data/" in frame.filename for frame in stack):
        return None
    for frame in reversed(stack):
        if any(part in frame.filename for part in ("/aiayn/", "/lightning/", "/torchmetrics/")):
            path = frame.filename
            for root in ("site-packages/", "src/"):
                path = path.split(root, 1)[-1]
            return f"{path}:{frame.lineno} {frame.name}"
    return "elsewhere"


class HostTensors(TorchFunctionMode):
    """Marks host tensors; records synchronisations while `recording`."""

    def __init__(self) -> None:
        super().__init__()
        self.recording = False
        self.syncs: list[str] = []
        self.collectives: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func in FACTORIES:
            explicit = kwargs.get("device") is not None
            if explicit and self.recording and func in (torch.tensor, torch.as_tensor):
                self.syncs.append(f"copy of host data to the device at {_where()}")
            return _mark(result, not explicit)
        if func is torch.from_numpy:
            return _mark(result, True)
        inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        host = [t for t in inputs if is_host(t)]
        if host and len(host) < len(inputs) and func not in INDEXING:
            # a CUDA kernel takes host tensors only as 0-dim scalars; its result is on the device
            wide = [tuple(t.shape) for t in host if t.dim() > 0]
            if wide:
                raise RuntimeError(
                    f"{getattr(func, '__name__', func)}: host tensors of shapes {wide} meet "
                    "device tensors (on a GPU: expected all tensors to be on the same device)"
                )
            return _mark(result, False)
        if func in MOVES and _names_device(args, kwargs):
            if host and self.recording and not kwargs.get("non_blocking", False):
                self.syncs.append(f"blocking copy to the device at {_where()}")
            if result is args[0]:  # a no-op move on the CPU: the moved tensor is a new one
                result = result.view_as(result)
            return _mark(result, False)
        if func in READS and not host and self.recording:
            where = _where()
            if where is not None:
                name = getattr(func, "__name__", func)
                self.syncs.append(f"{name} of a device tensor at {where}")
        return _mark(result, True) if host else result


# Lightning's helpers that make a collective for their caller (`self.log(sync_dist=True)`,
# `strategy.reduce`, `strategy.broadcast`): a collective is put down to the code that called them
HELPERS = (
    "/lightning/fabric/",
    "/lightning/pytorch/core/",
    "/lightning/pytorch/strategies/",
    "/lightning/pytorch/trainer/connectors/",
)


def _collective_origin() -> str:
    """file:line function of the innermost frame in aiayn or Lightning (not in Lightning's
    HELPERS) that called a collective; "fsdp" for FSDP's own collectives."""
    stack = traceback.extract_stack()[:-2]  # not this function nor the wrapper
    if any("/torch/distributed/fsdp/" in frame.filename for frame in stack):
        return "fsdp"
    for frame in reversed(stack):
        name = frame.filename
        if "/aiayn/" in name:
            return f"aiayn/{name.rsplit('/aiayn/', 1)[1]}:{frame.lineno} {frame.name}"
        if "/lightning/" in name and not any(helper in name for helper in HELPERS):
            return f"{name.split('site-packages/', 1)[-1]}:{frame.lineno} {frame.name}"
    return "elsewhere"


def _watched(name: str, collective: Any, mode: HostTensors, refuse_host: bool) -> Any:
    """`collective`, recorded in `mode` while it records; with `refuse_host`, refusing host
    tensors as NCCL does."""

    def checked(*args: Any, **kwargs: Any) -> Any:
        if refuse_host:
            for leaf in tree_flatten((args, kwargs))[0]:
                if is_host(leaf):
                    raise RuntimeError(
                        f"torch.distributed.{name}: a tensor made on the host without a device "
                        "(NCCL has no CPU backend; on a GPU this collective fails)"
                    )
        if mode.recording:
            origin = _collective_origin()
            if origin != "fsdp":
                mode.collectives.append(f"{name} at {origin}")
        return collective(*args, **kwargs)

    return checked


class GpuRules(L.Callback):
    """Installs the rules on each process of a run (in `setup`); writes the recorded
    synchronisations and collectives of each training step to `<report>.rank<r>.json`."""

    def __init__(self, report: str) -> None:
        self.report = report
        self.mode = HostTensors()
        self.steps: list[dict[str, Any]] = []
        self._update: int | None = None  # the update of the step being recorded
        self._logs = False  # whether Lightning writes that step's metrics

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if getattr(self, "_installed", False):
            return
        self._installed = True
        for name in COLLECTIVES:
            setattr(dist, name, _watched(name, getattr(dist, name), self.mode, True))
        for name in OTHER_COLLECTIVES:
            setattr(dist, name, _watched(name, getattr(dist, name), self.mode, False))
        from lightning.pytorch.loops import utilities

        utilities._distributed_is_initialized = lambda: False  # inference_mode, as on GPUs
        self.mode.__enter__()

    def _close_step(self, trainer: L.Trainer, last: bool = False) -> None:
        """The step recorded so far ends (a new one starts, validation starts, or the fit
        ends)."""
        if self.mode.recording:
            self.steps.append(
                {
                    "update": self._update,
                    # a stop asked after Lightning's hooks read the flag still logs the step
                    "log_step": self._logs or trainer.should_stop,
                    "last": last,
                    "syncs": self.mode.syncs,
                    "collectives": self.mode.collectives,
                }
            )
        self.mode.syncs, self.mode.collectives = [], []

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._close_step(trainer)
        self.mode.recording = True

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._update = trainer.fit_loop.epoch_loop._batches_that_stepped + 1
        self._logs = trainer._logger_connector.should_update_logs

    def on_validation_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._close_step(trainer)  # a step ends where validation starts
        self.mode.recording = False

    def on_train_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._close_step(trainer)
        self.mode.recording = False
        if self.steps:
            self.steps[-1]["last"] = True

    def on_test_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        assert torch.is_inference_mode_enabled(), "the test split is not under inference_mode"
        self.tested_under_inference_mode = True

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.mode.recording = False
        path = Path(f"{self.report}.rank{trainer.global_rank}.json")
        steps = [{"step": i, **step} for i, step in enumerate(self.steps)]
        tested = getattr(self, "tested_under_inference_mode", False)
        report = {"pid": os.getpid(), "steps": steps, "tested_under_inference_mode": tested}
        path.write_text(json.dumps(report, indent=1))
