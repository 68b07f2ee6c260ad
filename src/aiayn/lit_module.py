"""`TranslationModule`: the LightningModule around `Transformer`.

It owns the loss (label-smoothed cross-entropy over non-padding tokens), the optimizer and
its per-update schedule, the metrics (`train/*`, `val/*`, `test/*`) and what a checkpoint
carries besides weights: the tokenizer (so a checkpoint alone translates) and the random
number generator states (so a resumed run continues bit-for-bit).
"""

from __future__ import annotations

import random
import time
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.text import SacreBLEUScore

from aiayn.data.dataset import Batch
from aiayn.data.special import PAD
from aiayn.data.tokenizer import Tokenizers
from aiayn.model import DecodeConfig, ModelConfig, Transformer, generate
from aiayn.model.summary import parameter_summary
from aiayn.optim import OptimConfig, lr_multiplier


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Mean label-smoothed loss and mean NLL over the non-padding targets of one batch.

    (The mean is per batch: with gradient accumulation or DDP the update averages the batch
    means, where fairseq normalises by the tokens of the whole update.)

    logits (B, T, V), target (B, T) with PAD where there is no token. The smoothed target puts
    1 - ε on the gold token and ε spread uniformly over the vocabulary (as torch and the paper).
    """
    lprobs = logits.float().log_softmax(dim=-1)
    keep = target.ne(PAD)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.mean(dim=-1)
    ntokens = keep.sum().clamp(min=1)
    nll = (nll * keep).sum() / ntokens
    smooth = (smooth * keep).sum() / ntokens
    return (1.0 - epsilon) * nll + epsilon * smooth, nll


class TranslationModule(L.LightningModule):
    """Train, validate and test a `Transformer` on `Batch`es of token ids.

    Arguments are plain dicts (the resolved Hydra groups) so that
    `TranslationModule.load_from_checkpoint(path)` needs nothing else.
    """

    def __init__(
        self,
        model: dict[str, Any],
        optim: dict[str, Any],
        decode: dict[str, Any],
        val_bleu: bool = True,
        num_samples: int = 8,
        compile: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model_config = ModelConfig(**model)
        self.optim_config = OptimConfig(**optim)
        self.decode_config = DecodeConfig(**decode)
        self.model = Transformer(self.model_config)
        if compile:
            self.model.compile()  # in place: parameter names and checkpoints stay the same
        self.tokenizers: Tokenizers | None = None
        self.nll = nn.ModuleDict({"val": MeanMetric(), "test": MeanMetric()})
        self.bleu = nn.ModuleDict({"val": SacreBLEUScore(), "test": SacreBLEUScore()})
        self.samples: list[dict[str, str]] = []
        self._rng_to_restore: dict[str, Any] | None = None
        self._last_step_end: float | None = None
        self.train_tokens, self.train_seconds = 0, 0.0  # this process, for the run's mean rate

    # ------------------------------------------------------------------ forward and loss
    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V); padding masks come from pad ids."""
        return self.model(src, tgt_in)

    def _losses(self, batch: Batch) -> tuple[Tensor, Tensor]:
        logits = self(batch.src, batch.tgt_in)
        return label_smoothed_loss(logits, batch.tgt_out, self.optim_config.label_smoothing)

    # ------------------------------------------------------------------ training
    def on_train_batch_start(self, batch: Batch, batch_idx: int) -> None:
        if self._rng_to_restore is not None:  # deferred: the loaders have drawn their seeds
            _set_rng_state(self._rng_to_restore)
            self._rng_to_restore = None
        if self._last_step_end is None:
            self._last_step_end = time.perf_counter()

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        loss, nll = self._losses(batch)
        size = batch.src.size(0)
        # averaged over ranks, so the DDP curve is the global batch's, not rank 0's share
        self.log("train/loss", loss, prog_bar=True, batch_size=size, sync_dist=True)
        self.log("train/ppl", torch.exp(nll.detach()), batch_size=size, sync_dist=True)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], batch_size=size)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Batch, batch_idx: int) -> None:
        now = time.perf_counter()
        elapsed = max(now - (self._last_step_end or now), 1e-9)
        self._last_step_end = now
        # real (non-pad) source + target tokens per second, summed over ranks
        tokens = batch.num_src_tokens + batch.num_tgt_tokens
        self.train_tokens, self.train_seconds = (
            self.train_tokens + tokens,
            self.train_seconds + elapsed,
        )
        rate = torch.tensor(tokens / elapsed)
        self.log("train/tokens_per_sec", rate, batch_size=1, sync_dist=True, reduce_fx="sum")

    def on_validation_start(self) -> None:
        self._last_step_end = None  # validation time is not training throughput

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        self.log("train/grad_norm", torch.nn.utils.get_total_norm(grads))

    def configure_optimizers(self) -> dict[str, Any]:
        cfg = self.optim_config
        optimizer = torch.optim.Adam(
            self.parameters(),
            lr=cfg.lr,
            betas=(cfg.betas[0], cfg.betas[1]),
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
        )
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_multiplier(cfg, self.model_config.d_model)
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": schedule, "interval": "step", "frequency": 1},
        }

    # ------------------------------------------------------------------ evaluation
    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def on_validation_epoch_start(self) -> None:
        self.samples = []

    def on_test_epoch_start(self) -> None:
        self.samples = []

    def _evaluate(self, batch: Batch, split: str) -> None:
        _, nll = self._losses(batch)
        self.nll[split].update(nll, weight=batch.tgt_out.ne(PAD).sum())
        if not self.hparams.val_bleu and split == "val":
            return
        hyps = self.translate_batch(batch.src)
        refs = self.trainer.datamodule.references(split)
        refs = [refs[i] for i in batch.ids.tolist()]
        if self.tokenizers.lowercases("tgt"):  # the model cannot produce capitals
            refs = [r.lower() for r in refs]
        self.bleu[split].update(hyps, [[r] for r in refs])
        wanted = self.hparams.num_samples - len(self.samples)
        if wanted > 0:
            sources = self.trainer.datamodule.sources(split)
            rows = zip(batch.ids.tolist(), hyps, refs, strict=True)
            self.samples += [
                {"source": sources[i], "reference": ref, "hypothesis": hyp}
                for i, hyp, ref in list(rows)[:wanted]
            ]

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    def _log_epoch(self, split: str) -> None:
        nll = self.nll[split].compute()
        self.log(f"{split}/loss", nll, sync_dist=False)
        self.log(f"{split}/ppl", torch.exp(nll), sync_dist=False)
        self.nll[split].reset()
        if self.hparams.val_bleu or split == "test":
            # torchmetrics returns a fraction; BLEU is reported on sacreBLEU's 0-100 scale
            self.log(f"{split}/bleu", 100.0 * self.bleu[split].compute(), sync_dist=False)
            self.bleu[split].reset()

    @torch.no_grad()
    def translate_batch(self, src: Tensor, decode: DecodeConfig | None = None) -> list[str]:
        """Best detokenized translation of each row of src (B, S) (x + EOS, as `Batch.src`),
        decoded as `decode` says (default: the module's decode config)."""
        if self.tokenizers is None:
            raise RuntimeError(
                "TranslationModule.tokenizers is not set; load a checkpoint or "
                "attach the datamodule's tokenizers before decoding"
            )
        hyps = generate(self.model, src, decode or self.decode_config)
        return self.tokenizers.decode([h[0].tokens for h in hyps], side="tgt")

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.tokenizers is not None:
            checkpoint["tokenizers"] = self.tokenizers.state()
        checkpoint["rng_states"] = _get_rng_state()
        if self._trainer is not None and self.trainer.world_size > 1:
            # every rank draws its own dropout masks: keep each rank's torch RNG state (this
            # hook runs on every rank; rank 0 writes the file)
            per_rank = self.all_gather(torch.get_rng_state().to(self.device, torch.int64))
            checkpoint["rng_states"]["torch_per_rank"] = per_rank.to("cpu", torch.uint8)
        checkpoint["parameter_summary"] = parameter_summary(self.model)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "tokenizers" in checkpoint:
            self.tokenizers = Tokenizers.from_state(checkpoint["tokenizers"])
        if self._trainer is not None and "rng_states" in checkpoint:
            state = dict(checkpoint["rng_states"])
            per_rank = state.pop("torch_per_rank", None)
            if per_rank is not None and len(per_rank) == self.trainer.world_size:
                state["torch"] = per_rank[self.trainer.global_rank].clone()  # a view segfaults
            self._rng_to_restore = state


def _get_rng_state() -> dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": _numpy_state_to_torch(np.random.get_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(_numpy_state_from_torch(state["numpy"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _numpy_state_to_torch(state: tuple) -> dict[str, Any]:
    """numpy's RNG state in types `torch.load(weights_only=True)` accepts."""
    name, keys, pos, has_gauss, cached = state
    return {
        "name": name,
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached": float(cached),
    }


def _numpy_state_from_torch(state: dict[str, Any]) -> tuple:
    keys = state["keys"].numpy().astype(np.uint32)
    return state["name"], keys, state["pos"], state["has_gauss"], state["cached"]
