"""Training speed: one optimizer update of aiayn (the LightningModule's loss and the optimizer
it configures, i.e. what `python train.py` runs), `torch.nn.Transformer` and Hugging Face
`MarianMTModel` at three shapes, interleaved in one process on the same batch.

    python benchmarks/train_speed.py [--batch-size 64 --src-len 24 --tgt-len 24 --vocab 8000
        --repeats 5 --threads 2 --shapes tiny,small,base --device auto]
    python benchmarks/train_speed.py --device cuda --shapes tiny,small,base,big --batch-size 256

Each update: forward, label-smoothed (0.1) cross-entropy over the target tokens, backward, one
optimizer step (aiayn: its Adam; the peers: `torch.optim.AdamW`, as their trainers use), dropout
0.1 on all three. Prints the machine and its measured matrix-multiply peak, then target tokens/s
(best of `--repeats` rounds, the three models alternating within a round so that load hits all
alike), the ratios, and aiayn's model-FLOP utilisation, defined once for the project
(`aiayn.kernels.machine`, the same as `train/mfu`): 3 x `aiayn.model.summary.forward_flops`
per second over `mfu_peak`, a GPU's datasheet dense peak for the precision in use (the
measured peak printed beside it), a CPU's measured peak. `--aiayn eager,compiled` puts aiayn
eager and compiled (`compile=true`: model, output layer and loss as one graph, every batch
dimension symbolic) side by side; two more variants try what `compile=true` could become:
`static` (a graph for the batch's shape, `dynamic=False`), `batch` (the batch dimension alone
symbolic, `torch._dynamo.mark_dynamic`: one graph for any number of sentences of these
lengths) and `graphs` (the static graph replayed as CUDA graphs, `mode="reduce-overhead"`).
The first two updates of each variant (its compilation) are timed and printed under the
table. `--sdpa efficient|cudnn|math` pins every model's attention to one of
`F.scaled_dot_product_attention`'s backends (default: torch's choice; not flash, which takes
no attention mask, while aiayn keeps its padding masks on a GPU);
on a GPU each step's peak memory above the models' resident weights and optimizer states is
given too. On a GPU (`--device cuda`) all run under autocast in the card's
training precision (bf16 from compute capability 8.0 on, else fp16, as `trainer.precision=auto`
picks) and aiayn runs `kernels=gpu` (the output layer fused into the loss a block at a time).
The paper's batch of 25 000 target tokens: `--batch-size 520 --src-len 48 --tgt-len 48`; an
8-GPU run's micro-batch of 3 125: `--batch-size 65`. On the CPU the process's malloc
keeps freed memory (`aiayn.kernels.allocator`), as `train.py` sets it; that is process-wide, so
the peers run with it too (they gain more from it than aiayn, whose loss allocates less);
`AIAYN_KEEP_FREED_MEMORY=0` measures all three with glibc's default."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, replace

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from aiayn.data.dataset import Batch
from aiayn.kernels import resolve, use
from aiayn.kernels.allocator import keep_freed_memory
from aiayn.kernels.machine import bf16_native, cpu_flags, cpu_model, matmul_flops, mfu_peak
from aiayn.model import ModelConfig
from aiayn.model.summary import forward_flops
from aiayn.training.module import TranslationModule

SHAPES = {  # d_model, layers (each side), heads, d_ff
    "tiny": (128, 4, 4, 256),  # the fairseq-style tiny shape of experiment=multi30k_tiny
    "small": (256, 3, 8, 1024),
    "base": (512, 6, 8, 2048),  # the paper's base
    "big": (1024, 6, 16, 4096),  # the paper's big (GPUs: --device cuda)
}
SMOOTHING, DROPOUT = 0.1, 0.1
CPU_SHAPES = ("tiny", "small", "base")  # what a 2-core CPU times in minutes
BATCH_DIMS = ("src", "tgt_in", "tgt_out")  # the loss's inputs, (B, L) each
# aiayn's variants: how its loss (model, output layer, loss) is compiled; "compiled" is what
# compile=true runs (aiayn.training.module), the other two are tried here only
VARIANTS: dict[str, dict[str, object] | None] = {
    "eager": None,
    "compiled": {"dynamic": True},
    "static": {"dynamic": False},
    "batch": {"dynamic": False},  # and the batch dimension marked dynamic (aiayn_step)
    "graphs": {"dynamic": False, "mode": "reduce-overhead"},
}
# --sdpa: the backends F.scaled_dot_product_attention may pick from (flash takes no mask:
# aiayn's attention, which passes its padding masks on a GPU, would find no kernel)
SDPA = {
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


def aiayn_step(
    shape: tuple[int, ...],
    vocab: int,
    batch: Batch,
    compile: bool | str = False,
    phases: dict[str, list[float]] | None = None,
    dropout: float = DROPOUT,
) -> Callable[[], None]:
    """One update of aiayn; `compile`: False/True (eager, `compile=true`) or a `VARIANTS` name."""
    variant = compile if isinstance(compile, str) else ("compiled" if compile else "eager")
    d, layers, heads, ff = shape
    config = ModelConfig(
        src_vocab_size=vocab,
        tgt_vocab_size=vocab,
        d_model=d,
        num_heads=heads,
        num_encoder_layers=layers,
        num_decoder_layers=layers,
        d_ff=ff,
        dropout=dropout,
        max_positions=256,
    )
    optim = {"schedule": "inverse_sqrt", "lr": 1e-3, "warmup_steps": 100}
    module = TranslationModule(asdict(config), optim, {}, compile=variant == "compiled")
    if variant in ("static", "batch", "graphs"):  # what compile=true compiles, other options
        module._step_losses = torch.compile(module._losses, **VARIANTS[variant])  # type: ignore
    if variant == "batch":  # its own tensors: a mark stays on the tensor, for later variants too
        batch = replace(batch, **{name: getattr(batch, name).clone() for name in BATCH_DIMS})
        for name in BATCH_DIMS:
            torch._dynamo.mark_dynamic(getattr(batch, name), 0)
    module = module.to(batch.src.device).train()
    optimizer = module.configure_optimizers()["optimizer"]
    graphs = variant == "graphs"

    def step() -> None:
        if graphs:  # a new update: the graphs' outputs of the last one may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        start = time.perf_counter()
        loss, _ = module.losses(batch)
        forward = time.perf_counter()
        loss.backward()
        backward = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if phases is not None:  # seconds of each phase (CPU: no device to wait for)
            end = time.perf_counter()
            for name, seconds in [
                ("forward and loss", forward - start),
                ("backward", backward - forward),
                ("optimizer step", end - backward),
            ]:
                phases.setdefault(name, []).append(seconds)

    return step


class TorchSeq2Seq(nn.Module):
    """`nn.Transformer` with shared embeddings, sinusoid-free learned positions (cost alike)
    and a tied output projection: the usual way to build the paper's model from torch."""

    def __init__(self, shape: tuple[int, ...], vocab: int) -> None:
        super().__init__()
        d, layers, heads, ff = shape
        self.embed = nn.Embedding(vocab, d)
        self.positions = nn.Embedding(256, d)
        self.core = nn.Transformer(d, heads, layers, layers, ff, DROPOUT, batch_first=True)
        self.scale = d**0.5

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        def embed(x: torch.Tensor) -> torch.Tensor:
            return self.embed(x) * self.scale + self.positions.weight[: x.size(1)]

        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), device=tgt.device)
        hidden = self.core(embed(src), embed(tgt), tgt_mask=causal, tgt_is_causal=True)
        return hidden @ self.embed.weight.T


def torch_step(shape: tuple[int, ...], vocab: int, batch: Batch) -> Callable[[], None]:
    model = TorchSeq2Seq(shape, vocab).to(batch.src.device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        logits = model(batch.src, batch.tgt_in)
        loss = F.cross_entropy(
            logits.flatten(0, 1), batch.tgt_out.flatten(), label_smoothing=SMOOTHING
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def marian_step(shape: tuple[int, ...], vocab: int, batch: Batch) -> Callable[[], None]:
    from transformers import MarianConfig, MarianMTModel

    d, layers, heads, ff = shape
    model = (
        MarianMTModel(
            MarianConfig(
                vocab_size=vocab,
                decoder_vocab_size=vocab,
                d_model=d,
                encoder_layers=layers,
                decoder_layers=layers,
                encoder_attention_heads=heads,
                decoder_attention_heads=heads,
                encoder_ffn_dim=ff,
                decoder_ffn_dim=ff,
                activation_function="relu",
                max_position_embeddings=256,
                dropout=DROPOUT,
                attention_dropout=0.0,
                activation_dropout=0.0,
                scale_embedding=True,
                pad_token_id=0,
                eos_token_id=2,
                decoder_start_token_id=0,
            )
        )
        .to(batch.src.device)
        .train()
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    mask = torch.ones_like(batch.src)

    def step() -> None:
        out = model(input_ids=batch.src, attention_mask=mask, decoder_input_ids=batch.tgt_in)
        loss = F.cross_entropy(
            out.logits.flatten(0, 1), batch.tgt_out.flatten(), label_smoothing=SMOOTHING
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def best_seconds(
    steps: list[Callable[[], None]],
    repeats: int,
    sync: Callable[[], None],
    warm_up: list[float] | None = None,
) -> list:
    """Fastest of `repeats` timed calls of each step, after two warm-up calls each (their
    seconds appended to `warm_up`); the steps alternate within each round."""
    for step in steps:
        start = time.perf_counter()
        step()
        step()
        sync()
        if warm_up is not None:
            warm_up.append(time.perf_counter() - start)
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(repeats):
        for step, spent in zip(steps, times, strict=True):
            start = time.perf_counter()
            step()
            sync()
            spent.append(time.perf_counter() - start)
    return [min(spent) for spent in times]


def step_memory(step: Callable[[], None]) -> int:
    """Bytes of CUDA memory one more call of `step` allocates at its peak, above what was
    allocated before it (the models' weights and optimizer states)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def attention(backend: str | None) -> contextlib.AbstractContextManager:
    """`--sdpa`: SDPA limited to one backend, or torch's own choice (None)."""
    return sdpa_kernel(SDPA[backend]) if backend else contextlib.nullcontext()


def random_batch(args: argparse.Namespace, device: torch.device) -> Batch:
    """A batch without padding: every position is a real token, on every model."""
    g = torch.Generator().manual_seed(0)
    B, S, T, V = args.batch_size, args.src_len, args.tgt_len, args.vocab
    src = torch.randint(4, V, (B, S), generator=g)
    tgt = torch.randint(4, V, (B, T), generator=g)
    return Batch(
        src=src.to(device),
        tgt_in=tgt.to(device),
        tgt_out=tgt.roll(-1, dims=1).to(device),
        src_lengths=torch.full((B,), S, device=device),
        tgt_lengths=torch.full((B,), T, device=device),
        ids=torch.arange(B, device=device),
        num_src_tokens=B * S,
        num_tgt_tokens=B * T,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in [
        ("batch-size", 64),
        ("src-len", 24),
        ("tgt-len", 24),
        ("vocab", 8000),
        ("repeats", 5),
        ("threads", 2),
    ]:
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--shapes", default=",".join(CPU_SHAPES))
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument(
        "--aiayn",
        default="eager",
        help="aiayn's columns, comma-separated: eager, compiled (`compile=true`: the whole "
        "loss compiled as one graph), static, graphs (see the module docstring)",
    )
    parser.add_argument("--compile", action="store_true", help="the same as --aiayn compiled")
    parser.add_argument(
        "--sdpa", choices=sorted(SDPA), help="pin every model's attention to one SDPA backend"
    )
    args = parser.parse_args()
    variants = ["compiled"] if args.compile else args.aiayn.split(",")
    if not variants or set(variants) - set(VARIANTS):
        parser.error(f"--aiayn takes {', '.join(VARIANTS)}, got {args.aiayn!r}")
    if "graphs" in variants and not (args.device == "cuda" or torch.cuda.is_available()):
        parser.error("--aiayn graphs replays CUDA graphs: it needs --device cuda")
    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA GPU here")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.float32
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True  # as train.py sets on GPUs
        dtype = torch.bfloat16 if bf16_native("cuda") else torch.float16
    # as train.py does on the CPU (process-wide, so the peers get it too); not on GPU runs
    kept = not cuda and keep_freed_memory()
    peak = mfu_peak(dtype, device)  # the MFU's peak, as train/mfu's
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    batch = random_batch(args, device)

    where = torch.cuda.get_device_name() if cuda else f"{cpu_model()} ({' '.join(cpu_flags())})"
    print(f"machine: {where}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    policy = resolve("auto", on_gpu=cuda)
    use(policy)  # as train.py's kernels=auto: the CPU kernels on the CPU, the GPU's on GPUs
    print(f"aiayn kernels: {policy} (kernels=auto)")
    kind = str(dtype).removeprefix("torch.")
    print(f"MFU peak ({kind}, mfu_peak): {peak.flops / 1e9:.1f} GFLOP/s, {peak.source}")
    print(
        "malloc keeps freed memory (aiayn.kernels.allocator, as in train.py, for all three "
        f"models): "
        f"{'yes' if kept else 'no'}"
    )
    print(f"measured {kind} matmul peak: {peak.measured / 1e9:.1f} GFLOP/s")
    print(
        f"batch {args.batch_size} x {args.src_len} src x {args.tgt_len} tgt tokens "
        f"({args.batch_size * args.tgt_len} target tokens), vocab "
        f"{args.vocab}, label smoothing {SMOOTHING}, dropout {DROPOUT}, "
        f"{str(dtype).removeprefix('torch.') + ' autocast' if cuda else 'fp32'}, attention: "
        f"{args.sdpa or 'the backend torch picks'}"
    )
    names = [f"aiayn {v}" if len(variants) > 1 or v != "eager" else "aiayn" for v in variants]
    header = [*(f"{n} tgt tok/s" for n in names), "HF Marian", "torch.nn.Transformer"]
    header += ["aiayn / Marian", "aiayn / torch", *(f"{n} MFU" for n in names)]
    if cuda:  # each step's peak memory above what the three models keep resident
        header += [f"{n} step GiB" for n in names] + ["Marian step GiB", "torch step GiB"]
    print("| shape | " + " | ".join(header) + " |")
    print("|---|" + "---:|" * len(header))
    compilations: list[str] = []
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        torch.manual_seed(0)
        steps = [aiayn_step(shape, args.vocab, batch, v) for v in variants]
        steps += [build(shape, args.vocab, batch) for build in (marian_step, torch_step)]
        warm_up: list[float] = []
        with torch.autocast(device.type, dtype=dtype, enabled=cuda), attention(args.sdpa):
            seconds = best_seconds(steps, args.repeats, sync, warm_up)
            memory = [step_memory(step) for step in steps] if cuda else []
        *ours, marian, plain = seconds
        best = min(ours)
        tokens = args.batch_size * args.tgt_len
        d, layers, heads, ff = shape
        config = ModelConfig(
            src_vocab_size=args.vocab,
            tgt_vocab_size=args.vocab,
            d_model=d,
            num_heads=heads,
            num_encoder_layers=layers,
            num_decoder_layers=layers,
            d_ff=ff,
        )
        flops = 3 * forward_flops(config, args.batch_size, args.src_len, args.tgt_len)
        cells = [f"{tokens / t:.0f}" for t in seconds]
        cells += [f"{marian / best:.2f}x", f"{plain / best:.2f}x"]
        cells += [f"{flops / t / peak.flops:.1%}" for t in ours]
        cells += [f"{m / 2**30:.1f}" for m in memory]
        print(f"| {name} (d{d}, {layers}+{layers}, h{heads}, ff{ff}) | " + " | ".join(cells) + " |")
        firsts = ", ".join(f"{n} {t:.1f}" for n, t in zip(names, warm_up, strict=False))
        compilations.append(f"{name}: the first two updates (compilation included), s: {firsts}")
    print("\n".join(compilations))

    if not cuda and bf16_native():
        bf16_table(args, batch)


def bf16_table(args: argparse.Namespace, batch: Batch) -> None:
    """On a CPU with native bf16 (AVX-512 BF16 / AMX): aiayn's update in fp32 and under
    bf16 autocast (`trainer.precision=bf16-mixed`), alternating, and the bf16 peak."""
    peak = matmul_flops(torch.bfloat16, 2048, 5)
    print(f"\nmeasured bf16 matmul peak: {peak / 1e9:.1f} GFLOP/s (native bf16)")
    print("| shape | aiayn fp32 tgt tok/s | aiayn bf16-mixed | bf16-mixed / fp32 |")
    print("|---|---:|---:|---:|")
    for name in args.shapes.split(","):
        torch.manual_seed(0)
        fp32 = aiayn_step(SHAPES[name], args.vocab, batch)
        torch.manual_seed(0)
        update = aiayn_step(SHAPES[name], args.vocab, batch)

        def mixed(update: Callable[[], None] = update) -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                update()

        full, half = best_seconds([fp32, mixed], args.repeats, lambda: None)
        tokens = args.batch_size * args.tgt_len
        print(f"| {name} | {tokens / full:.0f} | {tokens / half:.0f} | {full / half:.2f}x |")


if __name__ == "__main__":
    main()
