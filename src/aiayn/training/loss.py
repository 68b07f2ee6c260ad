"""The paper's training loss: label-smoothed cross-entropy over the non-padding targets."""

from __future__ import annotations

from torch import Tensor


def label_smoothed_loss(
    logits: Tensor, target: Tensor, epsilon: float, pad_id: int = 0
) -> tuple[Tensor, Tensor]:
    """Mean label-smoothed loss and mean NLL over the non-padding targets of one batch.

    (The mean is per batch: with gradient accumulation or DDP the update averages the batch
    means, where fairseq normalises by the tokens of the whole update.)

    logits (B, T, V), target (B, T) with `pad_id` where there is no token. The smoothed target
    puts 1 - ε on the gold token and ε spread uniformly over the vocabulary (as torch and the
    paper).
    """
    lprobs = logits.float().log_softmax(dim=-1)
    keep = target.ne(pad_id)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.mean(dim=-1)
    ntokens = keep.sum().clamp(min=1)
    nll = (nll * keep).sum() / ntokens
    smooth = (smooth * keep).sum() / ntokens
    return (1.0 - epsilon) * nll + epsilon * smooth, nll
