"""Decoding speed: aiayn `generate`, its CTranslate2 export (float32 and int8) and Hugging
Face `transformers` `generate()` on a Marian model of the same size (random weights), greedy
and beam 4, same inputs and output lengths; on the CPU, or on a CUDA GPU (`--device cuda`).

    python benchmarks/decode_speed.py [--d-model 256 --heads 4 --layers 3 --ffn 1024
        --vocab 8000 --batch-size 32 --src-len 20 --new-tokens 30 --repeats 5 --threads 2
        --ct2-inter-threads 0 --ct2-intra-threads 0 --shape base --sentences N --device cpu]
    python benchmarks/decode_speed.py --device cuda --shape base --sentences 1000 \
        --batch-size 128 --repeats 2

`--shape base` is the paper's base model (d 512, 8 heads, 6 + 6 layers, ffn 2048, vocabulary
37 000; a flag given beside it wins). Each timed call decodes `--sentences` sentences (default:
one batch) in batches of `--batch-size`; sentences/s counts all of them.

Every engine decodes exactly `--new-tokens` tokens per sentence: EOS is disabled (aiayn: a
hook masks the EOS logit; HF: `eos_token_id=None`; CTranslate2: min = max decoding length),
and all keep a key/value cache. Prints the machine, then sentences/s (best of `--repeats`
alternating calls after a warm-up) for each strategy side by side, and the speed-ups over HF.
A second table has sentences end at different steps, as in a real batch: sentence i decodes
`L_i` steps (`output_lengths`: uniform in [new-tokens / 3, new-tokens]), its source `L_i`
tokens then padding; aiayn stops it by its length limit, HF by an EOS forced at that step.
CTranslate2 has no per-sentence limit and sits out.
"aiayn" decodes as it ships (float32 products on oneDNN or MKL by `aiayn.kernels.linear`'s
rule, the output projection on oneDNN on AMD CPUs; MKL's products on weights it packed once,
as `translate.py` and `evaluate.py` pack them once for all their batches); "aiayn MKL" with
every product on MKL (`AIAYN_ONEDNN=0`), to show what oneDNN buys on this CPU. CTranslate2 runs as
`translate.py engine=ctranslate2` does (`aiayn.inference.ct2.thread_split`): by default one
single-threaded replica per thread, the batch split among them; `--ct2-inter-threads 1` gives
CTranslate2's own default, one replica running `--threads` threads, and `--ct2-inter-threads 1
--ct2-intra-threads 1` one replica on one thread.

Each engine runs in a process of its own: a CTranslate2 translator that has run in a process
slows that process's torch products down by ~25 % (measured: aiayn greedy 211 -> 163 sent/s
while a used translator is alive, back to 216 once it is deleted), which in one shared
process would slow aiayn and HF alike and understate both.

With several batches (`--sentences` over `--batch-size`) the second table's sentences are
sorted by source length before they are cut into batches, each padded to its own longest, as
`translate.py` and `evaluate.py` batch a corpus (`Translator.translate_all`); one batch keeps
the drawn order.

On a GPU (`--device cuda`; the default, `--device cpu`, is everything above) each model runs
as `translate.py device=cuda` runs aiayn's (`aiayn.inference.load_checkpoint`): the weights
in `dtype=auto`'s type (bfloat16 on GPUs with native bf16, float16 on older ones; aiayn sums
its scores in float32) and, by `kernels=auto`, torch's own kernels (SDPA attention); HF's
Marian holds its weights in the same type, with transformers' default attention. The same
seed-0 weights and inputs as on the CPU, moved there. The EOS logit is masked in place by a
token index made once on the GPU, and HF's per-row EOS is forced without boolean indexing, so
that the benchmark adds no host-device synchronisation to either engine's steps. Every timed
call is bracketed by `torch.cuda.synchronize()`, after one warm-up call per engine and
strategy. "aiayn MKL" is a CPU setting and does not run. CTranslate2 is tried in bfloat16
("CT2 bf16") and with int8 weights computing in bfloat16 ("CT2 int8"), as one replica
(`thread_split("cuda")`); where it cannot run (not installed, or its PyPI wheel, which links
CUDA 12's cuBLAS, on a CUDA 13 machine) its cells read "skipped" and a line under the table
gives the error. The card, the torch and transformers versions and the whole run's seconds
are printed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path

import torch
import transformers
from transformers import LogitsProcessor, LogitsProcessorList, MarianConfig, MarianMTModel

from aiayn.export.ctranslate2 import ctranslate2_module, model_spec, save_spec
from aiayn.inference.checkpoint import resolve_dtype
from aiayn.inference.ct2 import sub_batch_size, thread_split
from aiayn.kernels import accelerate
from aiayn.kernels.linear import packed_weights
from aiayn.kernels.machine import cpu_model
from aiayn.model import DecodeConfig, ModelConfig, Transformer, generate

sys.path.insert(0, str(Path(__file__).parent))
from machine import describe

PAD, EOS = 0, 2
HELD = ExitStack()  # held for the process's life: aiayn's packed weights (`packed_weights`)
PAUSE = 0.3  # seconds before each timed call
# --shape NAME: d-model, heads, layers (each stack), ffn, vocab
SHAPES = {"base": {"d_model": 512, "heads": 8, "layers": 6, "ffn": 2048, "vocab": 37000}}


def build(args: argparse.Namespace) -> tuple[Transformer, MarianMTModel]:
    torch.manual_seed(0)
    ours = Transformer(  # as aiayn ships it on the CPU: its CPU kernels (aiayn.kernels)
        ModelConfig(
            src_vocab_size=args.vocab,
            tgt_vocab_size=args.vocab,
            d_model=args.d_model,
            num_heads=args.heads,
            num_encoder_layers=args.layers,
            num_decoder_layers=args.layers,
            d_ff=args.ffn,
            dropout=0.0,
            max_positions=512,
        )
    ).eval()
    accelerate(ours, "auto")
    marian = MarianMTModel(
        MarianConfig(
            vocab_size=args.vocab,
            decoder_vocab_size=args.vocab,
            d_model=args.d_model,
            encoder_layers=args.layers,
            decoder_layers=args.layers,
            encoder_attention_heads=args.heads,
            decoder_attention_heads=args.heads,
            encoder_ffn_dim=args.ffn,
            decoder_ffn_dim=args.ffn,
            activation_function="relu",
            max_position_embeddings=512,
            dropout=0.0,
            attention_dropout=0.0,
            activation_dropout=0.0,
            scale_embedding=True,
            pad_token_id=PAD,
            eos_token_id=2,
            decoder_start_token_id=PAD,
            forced_eos_token_id=None,
        )
    ).eval()
    return ours, marian


ENGINES = ("aiayn", "aiayn MKL", "CT2 fp32", "CT2 int8", "HF")  # HF last
# "aiayn, no graphs": decode.cuda_graphs=false, the shrinking batch without CUDA graphs
CUDA_ENGINES = ("aiayn", "aiayn, no graphs", "CT2 bf16", "CT2 int8", "HF")  # HF last
# CTranslate2's compute type of each CT2 engine, by device
CT2_TYPES = {
    "cpu": {"CT2 fp32": "float32", "CT2 int8": "int8"},
    "cuda": {"CT2 bf16": "bfloat16", "CT2 int8": "int8_bfloat16"},
}


def device_of(args: argparse.Namespace) -> str:
    """`--device`; the CPU for callers that make their own options (profile_decode.py)."""
    return getattr(args, "device", "cpu")


def sentences_of(args: argparse.Namespace) -> int:
    """`--sentences`; one batch for callers that make their own options."""
    return getattr(args, "sentences", 0) or args.batch_size


class Skipped(Exception):
    """An engine that cannot run on this machine (CTranslate2 on a GPU): its process answers
    every call with ``skipped: <why>`` instead of seconds."""


def one_line(error: BaseException) -> str:
    """``Type: message``, the message's first line only."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def products_on_mkl() -> None:
    """This process's float32 products all on MKL, as under ``AIAYN_ONEDNN=0``."""
    from aiayn.kernels import linear

    linear.ENABLED, linear.MKL_FORCED = False, True


def decoded_as_benchmarked(ours: Transformer) -> None:
    """aiayn as both tables decode it: never emitting EOS (its logit masked), so that each
    sentence ends at its length limit; on weights packed once for the process's life, as
    translate.py and evaluate.py pack them once for all their batches (nothing to pack on a
    GPU). On a GPU the mask is filled in place with an index made once there: no host-to-device
    copy per step."""
    HELD.enter_context(packed_weights(ours))
    if next(ours.parameters()).is_cuda:
        eos = torch.tensor([EOS], device=next(ours.parameters()).device)
        ours.output.register_forward_hook(
            lambda module, inputs, logits: logits.index_fill_(-1, eos, -1e9)
        )
        return
    ours.output.register_forward_hook(
        lambda module, inputs, logits: logits.index_fill(-1, torch.tensor([EOS]), -1e9)
    )


def on_device(
    ours: Transformer, marian: MarianMTModel, device: str
) -> tuple[Transformer, MarianMTModel]:
    """Both models as aiayn decodes on `device`: unchanged on the CPU; on a GPU in
    `dtype=auto`'s type (`resolve_dtype`) with torch's kernels (`accelerate`), as
    `load_checkpoint` places a checkpoint's model, and Marian in the same type."""
    if device == "cpu":
        return ours, marian
    where = torch.device(device)
    dtype = resolve_dtype("auto", where)
    ours = accelerate(ours.to(where, dtype).eval(), "auto")
    return ours, marian.to(where, dtype).eval()


def engine(name: str, args: argparse.Namespace) -> Callable[[int], None]:
    """`run(beams)`: one call of engine `name` on the benchmark's sentences (built from seed 0,
    so every process holds the same weights and inputs), batch by batch."""
    if name.startswith("CT2"):
        inter, intra = args.ct2_split
        return ct2_engine(args, CT2_TYPES[device_of(args)][name], inter, intra)
    ours, marian, src = models_and_batch(args)
    ours, marian = on_device(ours, marian, device_of(args))
    n = args.new_tokens
    if name.endswith(VARIED):
        return varied_engine(name.removesuffix(VARIED), ours, marian, args)
    batches = [batch.to(device_of(args)) for batch in src.split(args.batch_size)]
    if name == "aiayn MKL":
        products_on_mkl()
    if name.startswith("aiayn"):
        decoded_as_benchmarked(ours)  # no sentence may end early: HF runs with eos_token_id=None

        graphs = None if name == "aiayn" else False

        def run(beams: int) -> None:
            strategy = "greedy" if beams == 1 else "beam"
            config = DecodeConfig(
                strategy=strategy, beam_size=beams, max_len_a=0.0, max_len_b=n, cuda_graphs=graphs
            )
            for batch in batches:
                hyps = generate(ours, batch, config)
                assert all(len(h[0].tokens) == n for h in hyps)

        return run
    if name == "HF":

        @torch.inference_mode()
        def run(beams: int) -> None:
            for batch in batches:
                out = marian.generate(
                    input_ids=batch,
                    attention_mask=torch.ones_like(batch),
                    num_beams=beams,
                    do_sample=False,
                    max_new_tokens=n,
                    eos_token_id=None,
                    use_cache=True,
                    **({"length_penalty": 0.6} if beams > 1 else {}),
                )
                assert out.shape == (batch.size(0), n + 1)  # decoder start + n tokens

        return run
    raise ValueError(f"no engine {name!r}")


VARIED = ", varied lengths"  # engine-name suffix: each sentence's own output length


def output_lengths(args: argparse.Namespace) -> list[int]:
    """Varied lengths: sentence i decodes ``L_i`` tokens, drawn (seed 1) uniformly from
    ``[new_tokens / 3, new_tokens]``; its source has ``L_i`` real tokens, then padding."""
    g = torch.Generator().manual_seed(1)
    low = max(1, args.new_tokens // 3)
    return torch.randint(low, args.new_tokens + 1, (sentences_of(args),), generator=g).tolist()


def varied_batches(args: argparse.Namespace) -> list[tuple[torch.Tensor, list[int]]]:
    """The second table's batches, on the CPU: (sources, their lengths ``L_i``). Sentence i's
    source (seed 2) is padded after ``L_i`` tokens. One batch keeps the drawn order; several
    are cut from the sentences sorted by source length, as `Translator.translate_all` batches a
    corpus, each padded to its own longest."""
    lengths = output_lengths(args)
    g = torch.Generator().manual_seed(2)
    src = torch.randint(4, args.vocab, (sentences_of(args), max(lengths)), generator=g)
    for row, length in enumerate(lengths):
        src[row, length:] = PAD
    if sentences_of(args) <= args.batch_size:
        return [(src, lengths)]
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches = []
    for start in range(0, len(order), args.batch_size):
        chunk = order[start : start + args.batch_size]
        mine = [lengths[i] for i in chunk]
        batches.append((src[chunk, : max(mine)], mine))
    return batches


class EndAt(LogitsProcessor):
    """An HF logits processor: row r (sentence r // beams) may only take EOS at its step
    ``ends[r // beams]``, and never before."""

    def __init__(self, ends: list[int], beams: int) -> None:
        self.ends = torch.tensor(ends).repeat_interleave(beams)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.size(1)  # tokens so far, the decoder start included
        ending = self.ends == step
        scores[~ending, EOS] = float("-inf")
        scores[ending] = float("-inf")
        scores[ending, EOS] = 0.0
        return scores


class EndAtOnDevice(EndAt):
    """`EndAt` for a GPU: the same scores without boolean indexing, which would synchronise
    the host with the device at every step."""

    def __init__(self, ends: list[int], beams: int, vocab: int, device: torch.device) -> None:
        self.ends = torch.tensor(ends, device=device).repeat_interleave(beams)[:, None]
        self.is_eos = torch.arange(vocab, device=device)[None] == EOS  # (1, V)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        ending = self.ends == input_ids.size(1)  # (N, 1)
        scores.masked_fill_(ending != self.is_eos, float("-inf"))
        scores[:, EOS].masked_fill_(ending[:, 0], 0.0)
        return scores


def varied_engine(
    name: str, ours: Transformer, marian: MarianMTModel, args: argparse.Namespace
) -> Callable[[int], None]:
    """`run(beams)` where sentence i decodes `output_lengths(args)[i]` steps, as sentences of
    a real batch end at different steps (`varied_batches`): aiayn stops it there (length
    limit 1 x |src| + 0; EOS masked), HF forces its EOS at that step (a logits processor, by
    row: HF keeps every row of the batch to the end)."""
    batches = [(src.to(device_of(args)), lengths) for src, lengths in varied_batches(args)]
    if name == "aiayn":
        decoded_as_benchmarked(ours)

        def run(beams: int) -> None:
            strategy = "greedy" if beams == 1 else "beam"
            config = DecodeConfig(strategy=strategy, beam_size=beams, max_len_a=1.0, max_len_b=0)
            for src, lengths in batches:
                hyps = generate(ours, src, config)
                assert [len(h[0].tokens) for h in hyps] == lengths

        return run
    if name == "HF":

        def end_at(lengths: list[int], beams: int) -> LogitsProcessor:
            if device_of(args) == "cpu":
                return EndAt(lengths, beams)
            return EndAtOnDevice(lengths, beams, args.vocab, torch.device(device_of(args)))

        @torch.inference_mode()
        def run(beams: int) -> None:
            for src, lengths in batches:
                out = marian.generate(
                    input_ids=src,
                    attention_mask=src.ne(PAD).long(),
                    num_beams=beams,
                    do_sample=False,
                    max_new_tokens=src.size(1),
                    eos_token_id=EOS,
                    use_cache=True,
                    logits_processor=LogitsProcessorList([end_at(lengths, beams)]),
                    **({"length_penalty": 0.6} if beams > 1 else {}),
                )
                # decoder start + L_i - 1 tokens; on a GPU one copy to the host
                ended = [row.tolist().index(EOS) for row in out.cpu()]
                assert ended == lengths

        return run
    raise ValueError(f"no varied-length engine {name!r}")


def models_and_batch(args: argparse.Namespace) -> tuple[Transformer, MarianMTModel, torch.Tensor]:
    """The two models and the sources (`--sentences` of them), on the CPU, the same in every
    process (seed 0); torch's threads set."""
    torch.set_num_threads(args.threads)
    ours, marian = build(args)
    return ours, marian, torch.randint(4, args.vocab, (sentences_of(args), args.src_len))


def ct2_engine(
    args: argparse.Namespace,
    compute_type: str,
    inter: int,
    intra: int,
    **options: object,
) -> Callable[[int], None]:
    """`run(beams)` of aiayn's model exported to CTranslate2 (`compute_type`), as `inter`
    replicas of `intra` threads sharing out each batch; `options` go to `translate_batch`.
    On a GPU, whatever stops CTranslate2 (made, tried on one sentence, or called) raises
    `Skipped` with its error."""
    if device_of(args) == "cpu":
        return _ct2_engine(args, compute_type, inter, intra, **options)
    try:
        run = _ct2_engine(args, compute_type, inter, intra, **options)
        run(1, probe=True)
    except Exception as error:
        raise Skipped(one_line(error)) from None

    def guarded(beams: int) -> None:
        try:
            run(beams)
        except Exception as error:
            raise Skipped(one_line(error)) from None

    return guarded


def _ct2_engine(
    args: argparse.Namespace,
    compute_type: str,
    inter: int,
    intra: int,
    **options: object,
) -> Callable[..., None]:
    """`ct2_engine`'s `run(beams, probe=False)`, unguarded."""
    ours, _, src = models_and_batch(args)
    vocab = ["<pad>", "<bos>", "<eos>", "<unk>", *(f"w{i}" for i in range(4, args.vocab))]
    rows = [[vocab[i] for i in row] + ["<eos>"] for row in src.tolist()]
    batches = [rows[i : i + args.batch_size] for i in range(0, len(rows), args.batch_size)]
    with tempfile.TemporaryDirectory(prefix="ct2-bench-") as ct2_dir:  # read whole on loading
        save_spec(model_spec(ours, vocab, vocab), Path(ct2_dir))
        translator = ctranslate2_module().Translator(
            ct2_dir,
            device=device_of(args),
            compute_type=compute_type,
            inter_threads=inter,
            intra_threads=intra,
        )
    n = args.new_tokens

    def run(beams: int, probe: bool = False) -> None:
        """A call; `probe`: one sentence, one token, to see that CTranslate2 runs at all."""
        if probe:
            translator.translate_batch(rows[:1], beam_size=beams, max_decoding_length=1)
            return
        for batch in batches:
            out = translator.translate_batch(
                batch,
                beam_size=beams,
                max_decoding_length=n,
                min_decoding_length=n,
                max_batch_size=sub_batch_size(len(batch), inter),
                **options,
            )
            assert all(len(r.hypotheses[0]) == n for r in out)

    return run


def serve(make: Callable[[], Callable[[int], None]], conn: Connection) -> None:
    """An engine's own process (`make()` builds its `run`): answers each `beams` sent with the
    seconds of one call (on a GPU from one `torch.cuda.synchronize()` to the next), or, once
    the engine raised `Skipped`, with ``skipped: <why>``."""
    try:
        run, why = make(), ""
    except Skipped as error:
        run, why = None, f"skipped: {error}"
    sync = torch.cuda.synchronize if torch.cuda.is_initialized() else None
    conn.send("ready")
    while (beams := conn.recv()) is not None:
        if run is None:
            conn.send(why)
            continue
        if sync:
            sync()
        start = time.perf_counter()
        try:
            run(beams)
        except Skipped as error:
            run, why = None, f"skipped: {error}"
            conn.send(why)
            continue
        if sync:
            sync()
        conn.send(time.perf_counter() - start)


def receive(conn: Connection) -> object:
    """The next message from an engine's process; its exit (a traceback above) ends the run."""
    try:
        return conn.recv()
    except EOFError:
        raise SystemExit("an engine's process ended early: see its error above") from None


def best_times(conns: list[Connection], beams: int, repeats: int) -> list[float | str]:
    """Seconds of the fastest of `repeats` calls of each engine after one warm-up call each
    (for an engine that answered ``skipped: <why>``, that answer; it is not called again).
    The calls alternate between the engines, so that load from other processes hits all
    alike, and a pause before each lets the last engine's threads go idle."""
    skipped: dict[int, str] = {}
    for i, conn in enumerate(conns):
        conn.send(beams)
        reply = receive(conn)
        if isinstance(reply, str):
            skipped[i] = reply
    times: list[list[float]] = [[] for _ in conns]
    for _ in range(repeats):
        for i, (conn, spent) in enumerate(zip(conns, times, strict=True)):
            if i in skipped:
                continue
            time.sleep(PAUSE)
            conn.send(beams)
            reply = receive(conn)
            if isinstance(reply, str):
                skipped[i] = reply
            else:
                spent.append(reply)
    return [skipped[i] if i in skipped else min(spent) for i, spent in enumerate(times)]


def arguments(
    description: str,
    extra: tuple[tuple[str, int | str], ...] = (),
    devices: bool = False,
) -> argparse.Namespace:
    """The model (`--shape` for a preset), batch and timing options (and `extra`'s, typed as
    their defaults), parsed; torch's threads set. `devices`: also `--device cpu|cuda` and
    `--sentences` (otherwise the CPU and one batch); `--device cuda` where torch sees no GPU
    is refused as a usage error."""
    parser = argparse.ArgumentParser(description=description)
    for name, default in [
        ("d-model", 256),
        ("heads", 4),
        ("layers", 3),
        ("ffn", 1024),
        ("vocab", 8000),
        ("batch-size", 32),
        ("src-len", 20),
        ("new-tokens", 30),
        ("repeats", 5),
        ("threads", 2),
        *extra,
    ]:
        parser.add_argument(f"--{name}", type=type(default), default=default)
    parser.add_argument(
        "--shape", choices=sorted(SHAPES), help="a preset model shape; flags given beside it win"
    )
    if devices:
        parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
        parser.add_argument(
            "--sentences", type=int, default=0, help="sentences per timed call (0: one batch)"
        )
    shape = parser.parse_known_args()[0].shape
    if shape:
        parser.set_defaults(**SHAPES[shape])
    args = parser.parse_args()
    args.device, args.sentences = device_of(args), sentences_of(args)
    if args.batch_size < 1 or args.sentences < 1:
        parser.error("--batch-size and --sentences must be positive")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA GPU here")
    torch.set_num_threads(args.threads)
    return args


def sizes(args: argparse.Namespace) -> str:
    """The model and the sentences, in words."""
    batches = (
        f"batch {args.batch_size}"
        if sentences_of(args) == args.batch_size
        else f"{sentences_of(args)} sentences in batches of {args.batch_size}"
    )
    return (
        f"model d={args.d_model} h={args.heads} layers={args.layers}+{args.layers} "
        f"ffn={args.ffn} vocab={args.vocab}; {batches} x src {args.src_len} -> "
        f"{args.new_tokens} tokens"
    )


def print_setting(args: argparse.Namespace) -> None:
    """The machine, the library versions, the model and the batch."""
    if device_of(args) == "cuda":
        print_gpu_setting(args)
        return
    info = describe()
    print(f"machine: {info['cpu']}, {info['threads']} threads, flags {info['flags']}")
    print("aiayn kernels: cpu (kernels=auto on the CPU: aiayn.kernels.accelerate)")
    print(f"fp32 GEMM peak {info['fp32_gflops']} GFLOP/s, bf16 {info['bf16_gflops']}")
    print(f"ctranslate2 {ctranslate2_module().__version__}")
    threads = f"{args.threads} threads, one process per engine"
    print(f"{sizes(args)}; torch {torch.__version__}, {threads}")


def print_gpu_setting(args: argparse.Namespace) -> None:
    """`print_setting` on a GPU: the card, the versions, the precision, the model and batch."""
    where = torch.device("cuda")
    major, minor = torch.cuda.get_device_capability(where)
    memory = torch.cuda.get_device_properties(where).total_memory / 2**30
    print(
        f"device: {torch.cuda.get_device_name(where)} (compute capability {major}.{minor}, "
        f"{memory:.0f} GiB); host {cpu_model()}"
    )
    try:
        ct2 = f"ctranslate2 {ctranslate2_module().__version__}"
    except Exception as error:
        ct2 = f"ctranslate2 unavailable ({one_line(error)})"
    print(
        f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
        f"{transformers.__version__}, {ct2}"
    )
    dtype = str(resolve_dtype("auto", where)).removeprefix("torch.")
    print(
        f"weights {dtype} for aiayn (as translate.py/evaluate.py device=cuda dtype=auto) and HF; "
        "aiayn kernels: torch (kernels=auto on a GPU)"
    )
    print(
        f"{sizes(args)}; {args.threads} CPU threads, one process per engine; each timed call "
        "between torch.cuda.synchronize() calls, after a warm-up call"
    )


def start(
    makers: list[Callable[[], Callable[[int], None]]],
    env: list[dict[str, str | None]] | None = None,
) -> tuple[list[Connection], list[multiprocessing.process.BaseProcess]]:
    """One process per engine (`serve(maker)`), each started with this process's environment
    changed by ``env[i]`` (None: the variable unset); returns once all are ready."""
    spawn = multiprocessing.get_context("spawn")
    conns, workers = [], []
    for i, make in enumerate(makers):
        mine, theirs = spawn.Pipe()
        workers.append(spawn.Process(target=serve, args=(make, theirs), daemon=True))
        extra = env[i] if env else {}
        saved = {key: os.environ.get(key) for key in extra}
        for key, value in extra.items():  # a spawned child starts with the parent's environment
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        try:
            workers[-1].start()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        theirs.close()  # the child holds it: its exit then ends `receive` with EOFError
        conns.append(mine)
    for conn in conns:
        assert receive(conn) == "ready"
    return conns, workers


def stop(conns: list[Connection], workers: list[multiprocessing.process.BaseProcess]) -> None:
    """Ends the engines' processes."""
    for conn, worker in zip(conns, workers, strict=True):
        conn.send(None)
        worker.join()


def rate(sentences: int, seconds: float | str) -> str:
    return "skipped" if isinstance(seconds, str) else f"{sentences / seconds:.1f}"


def ratio(ours: float | str, theirs: float | str) -> str:
    """theirs / ours seconds: how many times faster `ours` is ('-' if either was skipped)."""
    if isinstance(ours, str) or isinstance(theirs, str):
        return "-"
    return f"{theirs / ours:.2f}x"


def main() -> None:
    begun = time.perf_counter()
    args = arguments(
        __doc__.splitlines()[0],
        (("ct2-inter-threads", 0), ("ct2-intra-threads", 0)),
        devices=True,
    )
    print_setting(args)
    # as translate.py does; computed here, where torch's threads are set, for every engine
    args.ct2_split = thread_split(args.device, args.ct2_inter_threads, args.ct2_intra_threads)
    inter, intra = args.ct2_split
    if args.device == "cpu":
        print(f"CTranslate2: {inter} replica(s) x {intra} thread(s), the batch split among them")
    else:
        print(f"CTranslate2: {inter} replica(s) on the GPU")
    names = ENGINES if args.device == "cpu" else CUDA_ENGINES
    conns, workers = start([partial(engine, name, args) for name in names])
    header = " | ".join(f"{x} sent/s" for x in names)
    print(f"| strategy | {header} | aiayn/HF | CT2 int8/HF |")
    print("|" + "---|" * (len(names) + 3))
    skipped: dict[str, str] = {}
    int8 = names.index("CT2 int8")
    for beams in (1, 4):
        seconds = best_times(conns, beams, args.repeats)
        rates = " | ".join(rate(args.sentences, t) for t in seconds)
        name = "greedy" if beams == 1 else f"beam {beams}"
        hf_s = seconds[-1]
        print(f"| {name} | {rates} | {ratio(seconds[0], hf_s)} | {ratio(seconds[int8], hf_s)} |")
        skipped |= {x: t for x, t in zip(names, seconds, strict=True) if isinstance(t, str)}
    for x, why in skipped.items():
        print(f"{x}: {why}")
    stop(conns, workers)
    lengths = output_lengths(args)
    print(
        f"\nvaried lengths: sentence i decodes its own L_i steps, {min(lengths)}-{max(lengths)} "
        f"(mean {sum(lengths) / len(lengths):.1f}), its source L_i tokens; CTranslate2 has no "
        "per-sentence length limit, so it sits out"
        + (
            f"; sorted by length into batches of {args.batch_size}, as translate.py batches"
            if args.sentences > args.batch_size
            else ""
        )
    )
    names = [f"aiayn{VARIED}", f"HF{VARIED}"]
    conns, workers = start([partial(engine, name, args) for name in names])
    print("| strategy | aiayn sent/s | HF sent/s | aiayn/HF |")
    print("|---|---|---|---|")
    for beams in (1, 4):
        ours_s, hf_s = best_times(conns, beams, args.repeats)
        name = "greedy" if beams == 1 else f"beam {beams}"
        rates = f"{rate(args.sentences, ours_s)} | {rate(args.sentences, hf_s)}"
        print(f"| {name} | {rates} | {ratio(ours_s, hf_s)} |")
    stop(conns, workers)
    if args.device == "cuda":
        print(f"\nwhole run {time.perf_counter() - begun:.0f} s")


if __name__ == "__main__":
    main()
