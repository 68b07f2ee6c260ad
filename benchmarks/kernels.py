"""The kernel-level measurements behind aiayn's CPU choices, each beside the alternative it
replaced, and the one-update A/B of aiayn's dropout against torch's:

- fresh vs reused pages: a copy of a 1536 x 8000 float32 tensor (a batch's logits) into
  memory glibc maps anew for each call, then into memory it keeps (`aiayn.kernels.allocator`);
- log-sum-exp of 1536 x 8000 logits whole vs a block of rows at a time (`training.loss`);
- dropout of a 64 x 24 x 512 activation: `F.dropout` (its mask from `bernoulli_`) vs aiayn's
  (`model.dropout`: two elements from each 31-bit integer);
- attention forward and backward on bf16 inputs, 64 x 4 heads x 24 x 32: torch's bf16 kernel
  vs `model.attention.sdpa` (which attends in float32 while training on the CPU);
- a decode step's output projection, 32 or 128 rows x 256 -> 8000, MKL vs oneDNN
  (`model.linear.DECODE_ONEDNN`);
- a decode step's products at decode_speed.py's model (d 256, ff 1024, vocabulary 8000), 32
  or 128 rows: MKL on the weight vs on MKL's packed copy of it (`model.linear.packed_weights`);
  and one whole `generate` call on that model (where packing is on), greedy and beam 4 on its
  batch and greedy on one sentence: on the weights vs packing them inside the call vs on weights
  packed once before;
- the output layer and the loss, forward and backward, 1536 rows x d_model -> 8000 at the
  three shapes' widths, in float32 and (where bf16 is native) under bf16 autocast: the whole
  logits then `label_smoothed_loss` vs `projected_label_smoothed_loss` (blocks of rows,
  gradients in the same loop);
- one training update at `train_speed.py`'s shapes with aiayn's dropout vs `F.dropout`, and
  with the whole logits vs the blocks (float32, and bf16-mixed where bf16 is native),
  alternating in one process (best of `--updates`).

    python benchmarks/kernels.py [--repeats 20] [--updates 7] [--threads 2]

Each line is the best of `--repeats` calls after warm-up. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from aiayn.kernels import accelerate
from aiayn.kernels import dropout as dropout_module
from aiayn.kernels import linear as linear_module
from aiayn.kernels.allocator import keep_freed_memory
from aiayn.kernels.linear import onednn_product, pack, packed_product, packed_weights
from aiayn.kernels.loss import _logsumexp_rows
from aiayn.kernels.machine import bf16_native
from aiayn.model import DecodeConfig, generate
from aiayn.model.attention import sdpa
from aiayn.model.embedding import OutputProjection
from aiayn.training import loss as loss_module
from aiayn.training.loss import label_smoothed_loss, projected_label_smoothed_loss

sys.path.insert(0, str(Path(__file__).parent))
from machine import describe
from train_speed import CPU_SHAPES, SHAPES, aiayn_step, best_seconds, random_batch


def best_ms(call: Callable[[], object], repeats: int) -> float:
    for _ in range(3):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def row(what: str, first: str, second: str, a: float, b: float) -> None:
    print(f"| {what} | {first} {a:.4g} ms | {second} {b:.4g} ms | {a / b:.2f}x |", flush=True)


def attention(attend: Callable[..., torch.Tensor]) -> Callable[[], None]:
    """Forward and backward of `attend(q, k, v)` on bf16 inputs that take gradients."""
    q, k, v = (torch.randn(64, 4, 24, 32).bfloat16().requires_grad_() for _ in range(3))
    grad = torch.randn(64, 4, 24, 32).bfloat16()
    return lambda: torch.autograd.grad(attend(q, k, v), (q, k, v), grad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--updates", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    info = describe()
    print(f"machine: {info['cpu']}, {args.threads} threads, flags {info['flags']}")
    print(f"fp32 peak {info['fp32_gflops']} GFLOP/s, bf16 {info['bf16_gflops']}; {info['torch']}")
    print("| what | first | second | first / second |")
    print("|---|---:|---:|---:|")
    logits = torch.randn(1536, 8000)
    fresh = best_ms(logits.clone, args.repeats)  # glibc's default: 49 MB are mmap'd anew
    kept = keep_freed_memory()
    reused = best_ms(logits.clone, args.repeats)
    row(
        "copy 1536 x 8000 (malloc keeps freed memory: " + str(kept) + ")",
        "fresh pages",
        "reused",
        fresh,
        reused,
    )
    whole = best_ms(lambda: logits.logsumexp(-1), args.repeats)
    row(
        "log-sum-exp 1536 x 8000",
        "whole",
        "row blocks",
        whole,
        best_ms(lambda: _logsumexp_rows(logits), args.repeats),
    )
    x = torch.randn(64, 24, 512)
    row(
        "dropout 0.1 of 64 x 24 x 512",
        "F.dropout",
        "aiayn",
        best_ms(lambda: F.dropout(x, 0.1), args.repeats),
        best_ms(lambda: dropout_module.dropout(x, 0.1), args.repeats),
    )
    row(
        "bf16 attention, forward + backward",
        "torch's bf16 kernel",
        "aiayn sdpa",
        best_ms(attention(F.scaled_dot_product_attention), args.repeats),
        best_ms(attention(lambda q, k, v: sdpa(q, k, v, None, 0.0, False)), args.repeats),
    )
    weight = torch.randn(8000, 256)
    for rows in (32, 128):
        h = torch.randn(rows, 256)
        row(
            f"output projection {rows} x 256 -> 8000",
            "oneDNN",
            "MKL",
            best_ms(lambda h=h: onednn_product(h, weight), args.repeats),
            best_ms(lambda h=h: F.linear(h, weight), args.repeats),
        )
    for n, k in ((768, 256), (256, 1024), (8000, 256)):
        w, b = torch.randn(n, k), torch.randn(n)
        packed = pack(w)  # whatever this CPU's default (AIAYN_PACK_WEIGHTS)
        if packed is None:  # a torch without MKL
            break
        for rows in (32, 128):
            h = torch.randn(rows, k)
            row(
                f"decode-step product {rows} x {k} -> {n}",
                "MKL",
                "MKL packed",
                best_ms(lambda h=h, w=w, b=b: F.linear(h, w, b), args.repeats),
                best_ms(
                    lambda h=h, w=w, b=b, p=packed: packed_product(h, p.tensor, w, b),
                    args.repeats,
                ),
            )
    if linear_module.PACKING:  # this CPU's default (AIAYN_PACK_WEIGHTS)
        decode_calls(args.repeats)
    target = torch.randint(4, 8000, (64, 24))
    for precision in ["fp32", "bf16-mixed"] if bf16_native() else ["fp32"]:
        for d_model in sorted({SHAPES[name][0] for name in CPU_SHAPES}):
            row(
                f"output layer + loss, {precision}, fwd + bwd, 1536 x {d_model} -> 8000",
                "whole logits",
                "row blocks",
                *(
                    best_ms(
                        autocast(precision, output_and_loss(d_model, target, loss)), args.repeats
                    )
                    for loss in (label_smoothed_loss, None)
                ),
            )
    sizes = argparse.Namespace(batch_size=64, src_len=24, tgt_len=24, vocab=8000)
    batch = random_batch(sizes, torch.device("cpu"))
    torch_dropout = (
        dropout_module,
        "dropout",
        lambda x, p, training=True: F.dropout(x, p, training),
    )
    whole_logits = (loss_module, "product_dtype", lambda x, weight: None)
    tables = [
        ("fp32", "F.dropout", "aiayn dropout", torch_dropout),
        ("fp32", "whole logits", "row blocks", whole_logits),
    ]
    if bf16_native():
        tables.append(("bf16-mixed", "whole logits", "row blocks", whole_logits))
    for precision, first, second, swap in tables:
        print()
        print(f"| one {precision} update | {first} tgt tok/s | {second} tgt tok/s | speed-up |")
        print("|---|---:|---:|---:|")
        for name, shape in ((name, SHAPES[name]) for name in CPU_SHAPES):
            ours, theirs = aiayn_step(shape, 8000, batch), aiayn_step(shape, 8000, batch)
            ours, theirs = autocast(precision, ours), autocast(precision, patched(theirs, *swap))
            t_ours, t_theirs = best_seconds([ours, theirs], args.updates, idle)
            rates = f"{batch.num_tgt_tokens / t_theirs:.0f} | {batch.num_tgt_tokens / t_ours:.0f}"
            print(f"| {name} | {rates} | {t_theirs / t_ours:.2f}x |", flush=True)


def decode_calls(repeats: int) -> None:
    """One `generate` call on decode_speed.py's model and batch (d 256, 3 + 3 layers, vocabulary
    8 000; 32 sentences x 20 tokens -> at most 30), greedy and beam 4, and greedy for its first
    sentence alone: on the weights themselves
    against the weights packed inside the call (what a lone call would pay), and against
    weights packed once before (what `Translator.decoding` holds over a corpus)."""
    # imported here: transformers probes for a package named `kernels` by importing it, which
    # from the benchmarks folder is this file; a transformers import at its top would be circular
    from decode_speed import build

    shape = argparse.Namespace(d_model=256, heads=4, layers=3, ffn=1024, vocab=8000)
    model, _ = build(shape)
    batch = torch.randint(4, shape.vocab, (32, 20))
    for strategy, beams, sentences in (("greedy", 1, 32), ("beam", 4, 32), ("greedy", 1, 1)):
        config = DecodeConfig(strategy=strategy, beam_size=beams, max_len_a=0.0, max_len_b=30)
        src = batch[:sentences]

        def decode(config: DecodeConfig = config, src: torch.Tensor = src) -> None:
            generate(model, src, config)

        def packing_in_the_call(config: DecodeConfig = config, src: torch.Tensor = src) -> None:
            with packed_weights(model):
                generate(model, src, config)

        plain = best_ms(decode, repeats)
        name = f"decode_speed's {strategy} call, {sentences} sentences"
        row(name, "weights", "packed in the call", plain, best_ms(packing_in_the_call, repeats))
        with packed_weights(model):
            row(name, "weights", "packed once before", plain, best_ms(decode, repeats))


def idle() -> None:
    """Nothing to wait for on the CPU (`best_seconds` synchronises a GPU with it)."""


def output_and_loss(
    d_model: int, target: torch.Tensor, loss: Callable[..., tuple] | None
) -> Callable[[], None]:
    """Forward and backward of the output layer (tied to nothing, 8000 words) and the
    label-smoothed loss on features ``(64, 24, d_model)``: `loss` over the whole logits, or
    (None) `projected_label_smoothed_loss`."""
    output = accelerate(OutputProjection(d_model, 8000), "cpu")  # as it ships on the CPU
    output.reset_parameters()
    features = torch.randn(64, 24, d_model, requires_grad=True)

    def run() -> None:
        if loss is None:
            value = projected_label_smoothed_loss(features, output, target, 0.1)[0]
        else:
            value = loss(output(features), target, 0.1)[0]
        torch.autograd.grad(value, (features, output.weight))

    return run


def autocast(precision: str, step: Callable[[], None]) -> Callable[[], None]:
    """`step` as is ("fp32") or under CPU bf16 autocast ("bf16-mixed", what
    `trainer.precision=bf16-mixed` runs)."""

    def run() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            step()

    return run


def patched(
    step: Callable[[], None], module: object, name: str, value: object
) -> Callable[[], None]:
    """`step` with `module.name` set to `value` while it runs (aiayn looks both swapped names
    up per call: `CPUDropout.forward` its `dropout`, the loss its `product_dtype`)."""
    ours = getattr(module, name)

    def run() -> None:
        setattr(module, name, value)
        try:
            step()
        finally:
            setattr(module, name, ours)

    return run


if __name__ == "__main__":
    main()
