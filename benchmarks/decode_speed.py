"""Decoding speed: aiayn `generate`, its CTranslate2 export (float32 and int8) and Hugging
Face `transformers` `generate()` on a Marian model of the same size (random weights), greedy
and beam 4, same inputs and output lengths.

    python benchmarks/decode_speed.py [--d-model 256 --heads 4 --layers 3 --ffn 1024
        --vocab 8000 --batch-size 32 --src-len 20 --new-tokens 30 --repeats 5 --threads 2
        --ct2-inter-threads 0 --ct2-intra-threads 0]

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
from transformers import MarianConfig, MarianMTModel

from aiayn.export.ctranslate2 import ctranslate2_module, model_spec, save_spec
from aiayn.inference.ct2 import sub_batch_size, thread_split
from aiayn.kernels import accelerate
from aiayn.kernels.linear import packed_weights
from aiayn.model import DecodeConfig, ModelConfig, Transformer, generate

sys.path.insert(0, str(Path(__file__).parent))
from machine import describe

PAD, EOS = 0, 2
HELD = ExitStack()  # held for the process's life: aiayn's packed weights (`packed_weights`)
PAUSE = 0.3  # seconds before each timed call


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


ENGINES = ("aiayn", "aiayn MKL", "CT2 fp32", "CT2 int8", "HF")  # HF last, CT2 int8 at [3]


def products_on_mkl() -> None:
    """This process's float32 products all on MKL, as under ``AIAYN_ONEDNN=0``."""
    from aiayn.kernels import linear

    linear.ENABLED, linear.MKL_FORCED = False, True


def decoded_as_benchmarked(ours: Transformer) -> None:
    """aiayn as both tables decode it: never emitting EOS (its logit masked), so that each
    sentence ends at its length limit; on weights packed once for the process's life, as
    translate.py and evaluate.py pack them once for all their batches."""
    HELD.enter_context(packed_weights(ours))
    ours.output.register_forward_hook(
        lambda module, inputs, logits: logits.index_fill(-1, torch.tensor([EOS]), -1e9)
    )


def engine(name: str, args: argparse.Namespace) -> Callable[[int], None]:
    """`run(beams)`: one call of engine `name` on the benchmark's batch (built from seed 0, so
    every process holds the same weights and inputs)."""
    if name.startswith("CT2"):
        inter, intra = args.ct2_split
        compute_type = name.split()[1].replace("fp32", "float32")
        return ct2_engine(args, compute_type, inter, intra)
    ours, marian, src = models_and_batch(args)
    n = args.new_tokens
    if name.endswith(VARIED):
        return varied_engine(name.removesuffix(VARIED), ours, marian, args)
    if name == "aiayn MKL":
        products_on_mkl()
    if name.startswith("aiayn"):
        decoded_as_benchmarked(ours)  # no sentence may end early: HF runs with eos_token_id=None

        def run(beams: int) -> None:
            strategy = "greedy" if beams == 1 else "beam"
            config = DecodeConfig(strategy=strategy, beam_size=beams, max_len_a=0.0, max_len_b=n)
            hyps = generate(ours, src, config)
            assert all(len(h[0].tokens) == n for h in hyps)

        return run
    if name == "HF":

        @torch.inference_mode()
        def run(beams: int) -> None:
            out = marian.generate(
                input_ids=src,
                attention_mask=torch.ones_like(src),
                num_beams=beams,
                do_sample=False,
                max_new_tokens=n,
                eos_token_id=None,
                use_cache=True,
                **({"length_penalty": 0.6} if beams > 1 else {}),
            )
            assert out.shape == (args.batch_size, n + 1)  # decoder start + n tokens

        return run
    raise ValueError(f"no engine {name!r}")


VARIED = ", varied lengths"  # engine-name suffix: each sentence's own output length


def output_lengths(args: argparse.Namespace) -> list[int]:
    """Varied lengths: sentence i decodes ``L_i`` tokens, drawn (seed 1) uniformly from
    ``[new_tokens / 3, new_tokens]``; its source has ``L_i`` real tokens, then padding."""
    g = torch.Generator().manual_seed(1)
    low = max(1, args.new_tokens // 3)
    return torch.randint(low, args.new_tokens + 1, (args.batch_size,), generator=g).tolist()


def varied_engine(
    name: str, ours: Transformer, marian: MarianMTModel, args: argparse.Namespace
) -> Callable[[int], None]:
    """`run(beams)` where sentence i decodes `output_lengths(args)[i]` steps, as sentences of
    a real batch end at different steps: its source (seed 2) is padded after that many tokens; aiayn
    stops it there (length limit 1 x |src| + 0; EOS masked), HF forces its EOS at that step
    (a logits processor, by row: HF keeps every row of the batch to the end)."""
    lengths = output_lengths(args)
    width = max(lengths)
    g = torch.Generator().manual_seed(2)
    src = torch.randint(4, args.vocab, (args.batch_size, width), generator=g)
    for row, length in enumerate(lengths):
        src[row, length:] = PAD
    if name == "aiayn":
        decoded_as_benchmarked(ours)

        def run(beams: int) -> None:
            strategy = "greedy" if beams == 1 else "beam"
            config = DecodeConfig(strategy=strategy, beam_size=beams, max_len_a=1.0, max_len_b=0)
            hyps = generate(ours, src, config)
            assert [len(h[0].tokens) for h in hyps] == lengths

        return run
    if name == "HF":
        from transformers import LogitsProcessor, LogitsProcessorList

        class EndAt(LogitsProcessor):
            """Row r (sentence r // beams) may only take EOS at its step, and never before."""

            def __init__(self, beams: int) -> None:
                self.ends = torch.tensor(lengths).repeat_interleave(beams)

            def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
                step = input_ids.size(1)  # tokens so far, the decoder start included
                ending = self.ends == step
                scores[~ending, EOS] = float("-inf")
                scores[ending] = float("-inf")
                scores[ending, EOS] = 0.0
                return scores

        @torch.inference_mode()
        def run(beams: int) -> None:
            out = marian.generate(
                input_ids=src,
                attention_mask=src.ne(PAD).long(),
                num_beams=beams,
                do_sample=False,
                max_new_tokens=width,
                eos_token_id=EOS,
                use_cache=True,
                logits_processor=LogitsProcessorList([EndAt(beams)]),
                **({"length_penalty": 0.6} if beams > 1 else {}),
            )
            ended = [row.tolist().index(EOS) for row in out]  # decoder start + L_i - 1 tokens
            assert ended == lengths

        return run
    raise ValueError(f"no varied-length engine {name!r}")


def models_and_batch(args: argparse.Namespace) -> tuple[Transformer, MarianMTModel, torch.Tensor]:
    """The two models and the source batch, the same in every process (seed 0); torch's
    threads set."""
    torch.set_num_threads(args.threads)
    ours, marian = build(args)
    return ours, marian, torch.randint(4, args.vocab, (args.batch_size, args.src_len))


def ct2_engine(
    args: argparse.Namespace,
    compute_type: str,
    inter: int,
    intra: int,
    **options: object,
) -> Callable[[int], None]:
    """`run(beams)` of aiayn's model exported to CTranslate2 (`compute_type`), as `inter`
    replicas of `intra` threads sharing out the batch; `options` go to `translate_batch`."""
    ours, _, src = models_and_batch(args)
    vocab = ["<pad>", "<bos>", "<eos>", "<unk>", *(f"w{i}" for i in range(4, args.vocab))]
    rows = [[vocab[i] for i in row] + ["<eos>"] for row in src.tolist()]
    with tempfile.TemporaryDirectory(prefix="ct2-bench-") as ct2_dir:  # read whole on loading
        save_spec(model_spec(ours, vocab, vocab), Path(ct2_dir))
        translator = ctranslate2_module().Translator(
            ct2_dir,
            device="cpu",
            compute_type=compute_type,
            inter_threads=inter,
            intra_threads=intra,
        )
    n = args.new_tokens

    def run(beams: int) -> None:
        out = translator.translate_batch(
            rows,
            beam_size=beams,
            max_decoding_length=n,
            min_decoding_length=n,
            max_batch_size=sub_batch_size(len(rows), inter),
            **options,
        )
        assert all(len(r.hypotheses[0]) == n for r in out)

    return run


def serve(make: Callable[[], Callable[[int], None]], conn: Connection) -> None:
    """An engine's own process (`make()` builds its `run`): answers each `beams` sent with the
    seconds of one call."""
    run = make()
    conn.send("ready")
    while (beams := conn.recv()) is not None:
        start = time.perf_counter()
        run(beams)
        conn.send(time.perf_counter() - start)


def receive(conn: Connection) -> object:
    """The next message from an engine's process; its exit (a traceback above) ends the run."""
    try:
        return conn.recv()
    except EOFError:
        raise SystemExit("an engine's process ended early: see its error above") from None


def best_times(conns: list[Connection], beams: int, repeats: int) -> list[float]:
    """Seconds of the fastest of `repeats` calls of each engine after one warm-up call each.
    The calls alternate between the engines, so that load from other processes hits all
    alike, and a pause before each lets the last engine's threads go idle."""
    for conn in conns:
        conn.send(beams)
        receive(conn)
    times: list[list[float]] = [[] for _ in conns]
    for _ in range(repeats):
        for conn, spent in zip(conns, times, strict=True):
            time.sleep(PAUSE)
            conn.send(beams)
            spent.append(receive(conn))
    return [min(spent) for spent in times]


def arguments(
    description: str, extra: tuple[tuple[str, int | str], ...] = ()
) -> argparse.Namespace:
    """The model, batch and timing options (and `extra`'s, typed as their defaults), parsed;
    torch's threads set."""
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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return args


def print_setting(args: argparse.Namespace) -> None:
    """The machine, the library versions, the model and the batch."""
    info = describe()
    print(f"machine: {info['cpu']}, {info['threads']} threads, flags {info['flags']}")
    print("aiayn kernels: cpu (kernels=auto on the CPU: aiayn.kernels.accelerate)")
    print(f"fp32 GEMM peak {info['fp32_gflops']} GFLOP/s, bf16 {info['bf16_gflops']}")
    print(f"ctranslate2 {ctranslate2_module().__version__}")
    print(
        f"model d={args.d_model} h={args.heads} layers={args.layers}+{args.layers} "
        f"ffn={args.ffn} vocab={args.vocab}; batch {args.batch_size} x src {args.src_len} -> "
        f"{args.new_tokens} tokens; torch {torch.__version__}, {args.threads} threads, "
        "one process per engine"
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


def main() -> None:
    args = arguments(__doc__.splitlines()[0], (("ct2-inter-threads", 0), ("ct2-intra-threads", 0)))
    print_setting(args)
    # as translate.py does; computed here, where torch's threads are set, for every engine
    args.ct2_split = thread_split("cpu", args.ct2_inter_threads, args.ct2_intra_threads)
    inter, intra = args.ct2_split
    print(f"CTranslate2: {inter} replica(s) x {intra} thread(s), the batch split among them")
    conns, workers = start([partial(engine, name, args) for name in ENGINES])
    header = " | ".join(f"{x} sent/s" for x in ENGINES)
    print(f"| strategy | {header} | aiayn/HF | CT2 int8/HF |")
    print("|" + "---|" * (len(ENGINES) + 3))
    for beams in (1, 4):
        seconds = best_times(conns, beams, args.repeats)
        rates = " | ".join(f"{args.batch_size / t:.1f}" for t in seconds)
        name = "greedy" if beams == 1 else f"beam {beams}"
        hf_s = seconds[-1]
        print(f"| {name} | {rates} | {hf_s / seconds[0]:.2f}x | {hf_s / seconds[3]:.2f}x |")
    stop(conns, workers)
    lengths = output_lengths(args)
    print(
        f"\nvaried lengths: sentence i decodes its own L_i steps, {min(lengths)}-{max(lengths)} "
        f"(mean {sum(lengths) / len(lengths):.1f}), its source L_i tokens; CTranslate2 has no "
        "per-sentence length limit, so it sits out"
    )
    names = [f"aiayn{VARIED}", f"HF{VARIED}"]
    conns, workers = start([partial(engine, name, args) for name in names])
    print("| strategy | aiayn sent/s | HF sent/s | aiayn/HF |")
    print("|---|---|---|---|")
    for beams in (1, 4):
        ours_s, hf_s = best_times(conns, beams, args.repeats)
        name = "greedy" if beams == 1 else f"beam {beams}"
        rates = f"{args.batch_size / ours_s:.1f} | {args.batch_size / hf_s:.1f}"
        print(f"| {name} | {rates} | {hf_s / ours_s:.2f}x |")
    stop(conns, workers)


if __name__ == "__main__":
    main()
