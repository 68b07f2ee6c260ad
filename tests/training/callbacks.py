"""Test-only callbacks, injected through the config (`+callbacks.x._target_=...`)."""

import os
import signal

import lightning as L


class KillAtStep(L.Callback):
    """SIGKILL the process when the update after `step` is about to start, i.e. after
    everything step `step` wrote (its validation and checkpoints) is on disk; only on DDP
    rank `rank` when given (a rank dying under the others). `signal="SIGSTOP"`: the process
    stops answering instead, as a hung one (or, to the others, a dead one under NCCL)."""

    def __init__(self, step: int, rank: int | None = None, signal: str = "SIGKILL") -> None:
        self.step, self.rank, self.signal = step, rank, signal

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):
            os.kill(os.getpid(), getattr(signal, self.signal))


class TermAtStep(L.Callback):
    """SIGTERM to the process when the update after `step` is about to start (once), only on
    DDP rank `rank` when given."""

    def __init__(self, step: int, rank: int | None = None) -> None:
        self.step, self.rank, self.sent = step, rank, False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        here = self.rank in (None, trainer.global_rank)
        if trainer.global_step == self.step and here and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)


class KillJobAtStep(KillAtStep):
    """KillAtStep in the Hydra multirun job whose number the environment's
    `AIAYN_TEST_KILL_JOB` gives (a sweep killed in that job); never without it, so a
    relaunch with the same overrides runs on."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        from hydra.core.hydra_config import HydraConfig

        if os.environ.get("AIAYN_TEST_KILL_JOB") == str(HydraConfig.get().job.num):
            super().on_train_batch_start(trainer, pl_module, batch, batch_idx)


class KillInValidationAt(L.Callback):
    """SIGKILL the process in the middle of the validation that runs at update `step`
    (after its first validation batch), i.e. before that validation's checkpoints."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_validation_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step and not trainer.sanity_checking:
            os.kill(os.getpid(), signal.SIGKILL)


class FailAtStep(L.Callback):
    """Raise inside training at `step`, to test what a failing job leaves behind."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"FailAtStep: injected failure at step {self.step}")


class NaNGradientAt(L.Callback):
    """Make the gradients of the update at `step` non-finite, and fail the run unless that
    update left every weight as it was; writes `done` into `marker` when it checked."""

    def __init__(self, step: int, marker: str) -> None:
        self.step, self.marker = step, marker
        self.before: dict | None = None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if trainer.global_step == self.step:
            next(p for p in pl_module.parameters() if p.grad is not None).grad[0] = float("nan")
            self.before = {k: v.clone() for k, v in pl_module.state_dict().items()}

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if self.before is not None:
            changed = [k for k, v in pl_module.state_dict().items() if not v.equal(self.before[k])]
            assert not changed, f"a skipped update changed {changed}"
            self.before = None
            with open(self.marker, "w") as file:
                file.write("done")


class WeightTrace(L.Callback):
    """Save the module's floating weights at fit start and after every update to `path`."""

    def __init__(self, path: str) -> None:
        self.path, self.trace = path, []

    def _record(self, pl_module) -> None:
        state = pl_module.state_dict()
        self.trace.append(
            {k: v.detach().clone() for k, v in state.items() if v.is_floating_point()}
        )

    def on_fit_start(self, trainer, pl_module) -> None:
        self._record(pl_module)

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self._record(pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        import torch

        torch.save(self.trace, self.path)


class RecordIds(L.Callback):
    """Append each training batch's example ids, with its epoch, to `<path>.<rank>` (one JSON
    list per line)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        import json

        with open(f"{self.path}.{trainer.global_rank}", "a") as file:
            file.write(json.dumps([trainer.current_epoch, batch.ids.tolist()]) + "\n")


class TermInTest(L.Callback):
    """SIGTERM to the process at the start of the test's first batch, only on DDP rank
    `rank` when given."""

    def __init__(self, rank: int | None = None) -> None:
        self.rank = rank

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if batch_idx == 0 and self.rank in (None, trainer.global_rank):
            os.kill(os.getpid(), signal.SIGTERM)


class ClockDueAtBatch(L.Callback):
    """Makes `LastCheckpoint`'s time interval due at the start of the epoch's batch
    `batch_idx` (as if its minutes had passed there), once."""

    def __init__(self, batch_idx: int) -> None:
        self.batch_idx, self.done = batch_idx, False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        from aiayn.callbacks.last_checkpoint import LastCheckpoint

        if batch_idx == self.batch_idx and not self.done:
            self.done = True
            for callback in trainer.callbacks:
                if isinstance(callback, LastCheckpoint):
                    callback._saved_at = float("-inf")
