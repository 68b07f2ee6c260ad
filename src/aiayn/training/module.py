"""`TranslationModule`: the LightningModule around the model (`Transformer` or the LSTM baseline).

It owns the loss (label-smoothed cross-entropy over non-padding tokens), the optimizer and
its per-update schedule, and the metrics (`train/*`, `val/*`, `test/*`); a checkpoint also
carries the tokenizer (so a checkpoint alone translates) and a parameter summary. Decoding
goes through `aiayn.inference.Translator` (as evaluate/translate do); RNG state, throughput,
samples and attention images are callbacks (`aiayn.callbacks`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.precision.amp import (
    _optimizer_handles_unscaling as _handles_unscaling,
)
from lightning.pytorch.callbacks import Timer
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torchmetrics import MeanMetric
from torchmetrics.text import SacreBLEUScore

from aiayn.callbacks.timer import SyncedTimer
from aiayn.data.dataset import Batch
from aiayn.data.tokenizer import Tokenizers
from aiayn.errors import ConfigError
from aiayn.inference.translator import Translator
from aiayn.kernels import accelerate
from aiayn.model import DecodeConfig, ModelConfig, build_model
from aiayn.model.summary import parameter_summary
from aiayn.training.guard import UpdateGuard
from aiayn.training.loggers import log_host, log_step, sync_step
from aiayn.training.loss import projected_label_smoothed_loss
from aiayn.training.schedules import OptimConfig, lr_multiplier
from aiayn.training.sharding import gathered, shard


class TranslationModule(L.LightningModule):
    """Train, validate and test a model (`build_model`) on `Batch`es of token ids.

    Arguments are plain dicts (the resolved Hydra groups) so that
    `TranslationModule.load_from_checkpoint(path)` needs nothing else. `tokenizers` must be
    set (by `aiayn.training.run`, or from a checkpoint) before validation decodes.
    `validation_step`/`test_step` return `{"hypotheses": [...]}` (the batch's translations,
    when decoded) for callbacks.
    """

    def __init__(
        self,
        model: dict[str, Any],
        optim: dict[str, Any],
        decode: dict[str, Any],
        val_bleu: bool = True,
        num_samples: int = 8,
        compile: bool = False,
        val_decode: dict[str, Any] | None = None,
    ) -> None:
        # num_samples is read by the samples callback (conf/callbacks/samples.yaml); it stays an
        # argument so that checkpoints, whose hyper-parameters hold it, keep loading
        super().__init__()
        self.save_hyperparameters()
        self.model_config = ModelConfig(**model)
        self.optim_config = OptimConfig(**optim)
        self.decode_config = DecodeConfig(**decode)
        self.val_decode_config = self.decode_config.updated(val_decode or {})
        # the process's kernel policy (kernels=..., set by aiayn.training.run): torch's own
        # modules on GPUs, the CPU kernels' subclasses of them on the CPU (aiayn.kernels)
        self.model = accelerate(build_model(self.model_config))
        # compile: the whole loss (model, output layer and loss, forward and backward) as one
        # graph with symbolic batch shapes (one graph for every batch, not one per shape); the
        # model stays eager for decoding, and names and checkpoints stay the same
        self._step_losses = self._losses
        if compile:
            self._step_losses = torch.compile(self._losses, dynamic=True)
        self.tokenizers: Tokenizers | None = None
        # non-finite gradients: skipped on the device, counted, the run stopped past the limit
        self.guard = UpdateGuard(
            self.optim_config.max_nonfinite_updates, self.optim_config.min_loss_scale
        )
        self._step_loss: Tensor | None = None
        self._grad_norm: Tensor | None = None
        # target tokens of the current update on this rank (token-normalised gradients)
        self._update_tokens = 0
        self.nll = nn.ModuleDict({"val": MeanMetric(), "test": MeanMetric()})
        self.bleu = nn.ModuleDict({"val": SacreBLEUScore(), "test": SacreBLEUScore()})
        self._whole_weights = ExitStack()  # `gathered` for a validation or test (fsdp)

    @property
    def translator(self) -> Translator:
        """Decodes with this module's model, tokenizers and decode settings."""
        if self.tokenizers is None:
            raise RuntimeError(
                "TranslationModule.tokenizers is not set; load a checkpoint or "
                "attach the datamodule's tokenizers before decoding"
            )
        return Translator(self.model, self.tokenizers, self.decode_config)

    # ------------------------------------------------------------------ forward and loss
    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V); padding masks come from pad ids
        (targets right-padded, as `aiayn.data` pads them)."""
        return self.model(src, tgt_in, tgt_right_padded=True)

    def losses(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """(label-smoothed loss, NLL), each a mean over the non-padding targets of `batch`
        (compiled as one graph with `compile=true`)."""
        return self._step_losses(batch.src, batch.tgt_in, batch.tgt_out)

    def _losses(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[Tensor, Tensor]:
        """`losses` of ``src (B, S)``, ``tgt_in (B, T)``, ``tgt_out (B, T)``."""
        features = self.model(src, tgt_in, features_only=True, tgt_right_padded=True)
        smoothing, pad = self.optim_config.label_smoothing, self.model_config.pad_id
        return projected_label_smoothed_loss(features, self.model.output, tgt_out, smoothing, pad)

    # ------------------------------------------------------------------ training
    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        """The loss of one update is normalised by the target tokens of the whole update, over
        its accumulation steps and DDP ranks (fairseq's semantics): each micro-batch
        back-propagates its summed loss over `_token_unit` (its mean weighted by its share of
        the micro-batch token budget: at most its mean, so that a GradScaler's scale of
        65 536 keeps float16 gradients finite, where the sum over 6 250 tokens overflowed)
        and `on_before_optimizer_step` scales the gradients by the unit over the update's
        token count. With one micro-batch on one rank that is the batch's mean, used as is.
        `train/loss` stays the per-token mean of each micro-batch."""
        loss, nll = self.losses(batch)
        self._step_loss = loss.detach()
        if log_step(self.trainer):  # between log steps nothing here waits for the device
            self._log_loss(self._step_loss, nll.detach())
            log_host(self, "train/lr", self.optimizers().param_groups[0]["lr"])
        if not self._normalises_over_update():
            return loss
        self._update_tokens += batch.num_tgt_tokens  # counted on the host by the collate
        return loss * (batch.num_tgt_tokens / self._token_unit())

    def _token_unit(self) -> float:
        """Tokens that weigh one mean loss in a micro-batch's backward: the data's micro-batch
        budget (`data.max_tokens`, the same on every rank), else one token."""
        config = getattr(self.trainer.datamodule, "cfg", None)
        return float(getattr(config, "max_tokens", None) or 1)

    def _log_loss(self, loss: Tensor, nll: Tensor) -> None:
        """`train/loss` and `train/ppl` of this micro-batch, averaged over ranks (so the DDP
        curve is the global batch's, not rank 0's share), read once and logged as host
        numbers: Lightning reads the progress bar's metrics at every step, and a device tensor
        there would make every step wait for the device. Called at log steps only
        (`log_step`); the bar shows the last log step's loss."""
        values = torch.stack([loss.float(), torch.exp(nll.float())])
        if self.trainer.world_size > 1:
            torch.distributed.all_reduce(values)  # the sum, without strategy.reduce's barrier
            values = values / self.trainer.world_size
        mean_loss, ppl = values.tolist()
        log_host(self, "train/loss", mean_loss, prog_bar=True)
        log_host(self, "train/ppl", ppl)

    def _normalises_over_update(self) -> bool:
        """Whether an update spans several micro-batches (accumulation or DDP ranks)."""
        return self.trainer.accumulate_grad_batches > 1 or self.trainer.world_size > 1

    def _normalise_gradients(self, grads: list[Tensor]) -> None:
        """Gradients of the summed losses (over `_token_unit`) -> gradients of the update's
        per-token mean, in place. Lightning divided each micro-batch's loss by the
        accumulation count and DDP averaged over ranks; both are undone by the factor."""
        tokens = torch.full((), float(self._update_tokens), device=self.device)  # no copy
        self._update_tokens = 0
        if self.trainer.world_size > 1:
            # queued on the device like the gradients' own reduction; Lightning's
            # strategy.reduce would add a barrier, which waits for the device and every rank
            torch.distributed.all_reduce(tokens)
        ranks = self.trainer.accumulate_grad_batches * self.trainer.world_size
        scale = ranks * self._token_unit() / tokens.clamp(min=1)
        torch._foreach_mul_(grads, scale)  # one kernel, not one a parameter

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Gradients as the update uses them: unscaled (a GradScaler leaves a fused optimizer
        to unscale them inside its step, so they are unscaled here, once), normalised over
        the update's tokens; log their norm, and skip the update where it is not finite
        (`aiayn.training.guard`: counted in `train/skipped_updates`, more than
        `optim.max_nonfinite_updates` in a row stop the run). No step here waits for the
        device: the skip happens in the optimizer's kernel."""
        scaler = self._grad_scaler()
        grads = [param.grad for param in _with_gradients(optimizer)]
        if scaler is not None:
            diverged = self.guard.diverged(self.device)  # then every update is skipped
            torch._foreach_mul_(grads, torch.where(diverged, float("nan"), 1.0))
            if _handles_unscaling(optimizer):
                scaler.unscale_(optimizer)
        if self._normalises_over_update():
            self._normalise_gradients(grads)
        norm = torch.nn.utils.get_total_norm(grads)
        if isinstance(norm, DTensor):  # sharded (trainer=fsdp): the norm over every share
            norm = norm.full_tensor()
        self._grad_norm = norm
        scale = scaler._get_scale_async() if scaler is not None else None
        lr = optimizer.param_groups[0]["lr"]
        skip = self.guard.observe(norm, self.trainer.global_step, self._step_loss, lr, scale)
        if log_step(self.trainer):  # what Lightning writes; a log call costs the host time
            self.log("train/grad_norm", norm)
            self.log("train/skipped_updates", self.guard.skipped)
        if scaler is not None:
            return  # the scaler saw the same non-finite gradients and skips the step
        if _handles_unscaling(optimizer):
            optimizer.found_inf = skip.float()  # read by the fused step, removed after it
        elif bool(skip):  # an optimizer without a device-side skip: the host decides
            for param in self.parameters():
                param.grad = None

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """`trainer.gradient_clip_val` on the unscaled gradients, by the norm just logged
        (Lightning's own clipping refuses fused optimizers under mixed precision)."""
        if not gradient_clip_val:
            return
        params = _with_gradients(optimizer)
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
        else:
            torch.nn.utils.clip_grads_with_norm_(params, gradient_clip_val, self._grad_norm)

    def optimizer_step(
        self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
    ) -> None:
        try:
            super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        finally:  # the skip flag set in on_before_optimizer_step is for this step only
            getattr(optimizer, "optimizer", optimizer).__dict__.pop("found_inf", None)

    def _grad_scaler(self) -> torch.amp.GradScaler | None:
        return getattr(self.trainer.precision_plugin, "scaler", None)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if sync_step(self.trainer):
            self.guard.check()  # where Lightning reads the logged metrics anyway

    def on_validation_epoch_start(self) -> None:
        if self.trainer.state.fn == "fit":
            self.guard.check()
        self._whole_weights.enter_context(gathered(self.model))

    def on_train_end(self) -> None:
        self.guard.check()

    def configure_optimizers(self) -> dict[str, Any]:
        cfg = self.optim_config
        params = list(self.parameters())
        # one fused kernel per step instead of a loop over parameters (CPU and CUDA)
        fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
        optimizer = torch.optim.Adam(
            params,
            lr=cfg.lr,
            betas=(cfg.betas[0], cfg.betas[1]),
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            fused=fused,
        )
        budget = self._budget_spent() if cfg.cooldown > 0 else None
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_multiplier(cfg, self.model_config.d_model, budget)
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": schedule, "interval": "step", "frequency": 1},
        }

    def _budget_spent(self) -> Callable[[int], float]:
        """`done` updates -> the share of the training budget used (optim.cooldown): the
        larger of done / the updates that trainer.max_steps or max_epochs allow and the share
        of trainer.max_time elapsed, by rank 0's clock so that every rank steps alike. The
        `SyncedTimer` of `aiayn.training.run` gives that clock without a collective (rank 0's
        reading at log steps, the same estimate on every rank between them); Lightning's own
        Timer (a Trainer built elsewhere) costs a broadcast every update."""
        trainer = self.trainer
        # inf without max_steps or max_epochs; -1 (max_steps) for epochs of unknown length
        total = trainer.estimated_stepping_batches
        total = total if total > 0 else float("inf")
        timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
        if total == float("inf") and timer is None:
            raise ConfigError(
                "optim.cooldown needs a budget of known length, and these epochs have none "
                "(the data's length is unknown): set trainer.max_steps or trainer.max_time"
            )

        def spent(done: int) -> float:
            share = done / total
            if isinstance(timer, SyncedTimer):
                timed = timer.budget_share(done)
                return min(share if timed is None else max(share, timed), 1.0)
            remaining = timer.time_remaining() if timer is not None else None
            if remaining is not None:
                elapsed = timer.time_elapsed()
                share = max(share, trainer.strategy.broadcast(elapsed / (elapsed + remaining)))
            return min(share, 1.0)

        return spent

    # ------------------------------------------------------------------ evaluation
    def validation_step(self, batch: Batch, batch_idx: int) -> dict[str, list[str]]:
        return self._evaluate(batch, "val")

    def test_step(self, batch: Batch, batch_idx: int) -> dict[str, list[str]]:
        return self._evaluate(batch, "test")

    def _evaluate(self, batch: Batch, split: str) -> dict[str, list[str]]:
        _, nll = self.losses(batch)
        self.nll[split].update(nll, weight=batch.tgt_out.ne(self.model_config.pad_id).sum())
        if not self._scores_bleu(split):
            return {}
        hyps = self.translator.translate_batch(batch.src, self.decode_settings(split))
        refs = self.trainer.datamodule.references(split)
        refs = [refs[i] for i in batch.ids.tolist()]
        if self.translator.tokenizers.lowercases("tgt"):  # the model cannot produce capitals
            refs = [r.lower() for r in refs]
        self.bleu[split].update(hyps, [[r] for r in refs])
        return {"hypotheses": hyps}

    def decode_settings(self, split: str) -> DecodeConfig:
        """Validation decodes with `val_decode` on top of `decode`; the test split (and every
        checkpoint's users) with `decode`."""
        return self.val_decode_config if split == "val" else self.decode_config

    def _scores_bleu(self, split: str) -> bool:
        return split == "test" or self.hparams.val_bleu

    # decoding calls more than forward: under trainer=fsdp every weight is gathered once for
    # the whole validation or test, not per batch (a model that is not sharded is left alone;
    # on_validation_epoch_start does the same)
    def on_test_epoch_start(self) -> None:
        self._whole_weights.enter_context(gathered(self.model))

    def on_validation_epoch_end(self) -> None:
        self._whole_weights.close()
        self._log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._whole_weights.close()
        self._log_epoch("test")

    def _log_epoch(self, split: str) -> None:
        nll = self.nll[split].compute()
        self.log(f"{split}/loss", nll, sync_dist=False)
        self.log(f"{split}/ppl", torch.exp(nll), sync_dist=False)
        self.nll[split].reset()
        if self._scores_bleu(split):
            # torchmetrics returns a fraction; BLEU is reported on sacreBLEU's 0-100 scale
            self.log(f"{split}/bleu", 100.0 * self.bleu[split].compute(), sync_dist=False)
            self.bleu[split].reset()

    def setup(self, stage: str) -> None:
        # DDP broadcasts a module's buffers from rank 0 before every forward: a collective in
        # every step, for buffers that never change here (the sinusoidal positions, the only
        # non-persistent ones, which every rank computes alike). DDP leaves out those named here.
        self._ddp_params_and_buffers_to_ignore = [
            f"{prefix}.{name}" if prefix else name
            for prefix, module in self.named_modules()
            for name in module._non_persistent_buffers_set
        ]

    def configure_model(self) -> None:
        """Shard the model where the strategy gives a device mesh (`trainer=fsdp`)."""
        if self.device_mesh is not None:
            shard(self.model, self.device_mesh, str(self.trainer.precision))

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.tokenizers is not None:
            checkpoint["tokenizers"] = self.tokenizers.state()
        checkpoint["parameter_summary"] = parameter_summary(self.model)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "tokenizers" in checkpoint:
            self.tokenizers = Tokenizers.from_state(checkpoint["tokenizers"])


def _with_gradients(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """The parameters an update changes (the optimizer's, which are all the module's) that
    have a gradient: read from the optimizer's groups, not by walking the modules
    (`self.parameters()`), which costs the host about a millisecond an update."""
    groups = getattr(optimizer, "optimizer", optimizer).param_groups  # Lightning's wrapper too
    return [p for group in groups for p in group["params"] if p.grad is not None]
