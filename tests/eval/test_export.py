"""CTranslate2 export: every model variant converts exactly (log-probabilities equal to the
PyTorch model's), a trained checkpoint decodes to the same greedy output in both engines,
int8 keeps the score, conversions are cached and refreshed, and the commands work."""

from __future__ import annotations

import json

import pytest
import torch

from aiayn.config import ExportConfig
from aiayn.errors import CheckpointError, ConfigError
from aiayn.export.ctranslate2 import cached_export, export, model_spec, save_spec
from aiayn.inference.ct2 import CT2Translator, load_translator, sub_batch_size, thread_split
from aiayn.inference.evaluation import run as evaluate
from aiayn.model import build_model
from tests.eval.conftest import reference_translations
from tests.helpers import CONFIG_ERRORS, cli, compose_config
from tests.model.model_helpers import random_tokens, tiny_config, tiny_model

ctranslate2 = pytest.importorskip("ctranslate2")

VARIANTS = {
    "post-norm": {},
    "pre-norm": {"norm_first": True},
    "learned positions": {"positional": "learned"},
    "gelu": {"activation": "gelu"},
    "head_dim 8 (attention width 32 != d_model 16)": {"head_dim": 8},
    "share none": {"share_embeddings": "none", "tgt_vocab_size": 19},
    "share decoder": {"share_embeddings": "decoder", "tgt_vocab_size": 19},
    "factorized embeddings": {"d_embed": 6},
    "pre-norm without final norms": {"norm_first": True, "final_norm": False},
    "unscaled embeddings, biased output": {
        "scale_embeddings": False,
        "output_bias": True,
        "share_embeddings": "none",
    },
    "seed 002: factorized, biased projection scaled after, embedding norm, direct output": {
        "d_embed": 6,
        "embedding_proj_bias": True,
        "embedding_scale_after_proj": True,
        "embedding_norm": True,
        "factorized_output": False,
        "share_embeddings": "none",
        "output_bias": True,
    },
    "seed 001: per-head shared Q/K/V matrices": {"shared_head_qkv": True},
    "no bias in the stacks' linear maps and norms": {
        "norm_first": True,
        "linear_bias": False,
        "norm_bias": False,
        "embedding_norm": True,
    },
    "pre-norm, learned, factorized, unshared": {
        "norm_first": True,
        "positional": "learned",
        "d_embed": 6,
        "share_embeddings": "none",
    },
}


def _vocab(size: int) -> list[str]:
    return ["<pad>", "<bos>", "<eos>", "<unk>", *(f"w{i}" for i in range(4, size))]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_converts_to_the_same_log_probabilities(variant, tmp_path):
    model = tiny_model(seed=3, **VARIANTS[variant])
    with torch.no_grad():  # biases and embedding norms that matter
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
            if (
                isinstance(module, (torch.nn.LayerNorm, torch.nn.Linear))
                and module.bias is not None
            ):
                module.bias.uniform_(-0.3, 0.3)
        for bias in (model.output.bias, model.src_embed.token.proj, model.tgt_embed.token.proj):
            if isinstance(bias, torch.nn.Linear):
                bias = bias.bias
            if bias is not None:
                torch.nn.init.normal_(bias)
    config = model.config
    src_vocab, tgt_vocab = _vocab(config.src_vocab_size), _vocab(config.tgt_vocab_size)
    save_spec(model_spec(model, src_vocab, tgt_vocab), tmp_path)
    engine = ctranslate2.Translator(str(tmp_path), device="cpu")

    src = random_tokens(3, 7, config.src_vocab_size, seed=5)
    src[:, -1] = config.eos_id
    src[1, 4:] = config.pad_id  # a shorter sentence in the batch
    src[1, 3] = config.eos_id
    tgt = random_tokens(3, 6, config.tgt_vocab_size, seed=6)
    tgt_in = torch.cat([torch.full((3, 1), config.bos_id), tgt], dim=1)
    with torch.no_grad():
        logprobs = model(src, tgt_in).log_softmax(-1)  # (3, 7, V)
    rows = [[src_vocab[i] for i in row if i != config.pad_id] for row in src.tolist()]
    targets = [[tgt_vocab[i] for i in row] for row in tgt.tolist()]
    scored = engine.score_batch(rows, targets)
    for b, result in enumerate(scored):
        # CTranslate2 scores the target tokens and the EOS it appends
        expected = [logprobs[b, t, i].item() for t, i in enumerate(tgt[b].tolist())]
        expected.append(logprobs[b, len(expected), config.eos_id].item())
        assert result.tokens == [*targets[b], "<eos>"]
        assert result.log_probs == pytest.approx(expected, abs=2e-4), variant


@pytest.fixture(scope="module")
def exported(ckpt, tmp_path_factory):
    return export(ckpt, tmp_path_factory.mktemp("ct2") / "model")


def test_trained_checkpoint_gives_the_same_greedy_translations(translator, exported, sources):
    greedy = {"strategy": "greedy", "max_len_a": 1.0, "max_len_b": 10}
    torch_engine = translator.with_settings(greedy)
    ct2 = CT2Translator(exported, "cpu").with_settings(greedy)
    lines = [*sources, "", "a b c " * 3]
    expected = reference_translations(torch_engine, lines)
    assert ct2.translate(lines) == expected
    assert len(set(expected)) > 3  # the model's output depends on its input
    src, _ = _collate(translator, sources)
    ours = torch_engine.generate(src)
    theirs = ct2.generate(src)
    for a, b in zip(ours, theirs, strict=True):
        assert a[0].tokens == b[0].tokens


def test_a_forced_prefix_decodes_as_aiayn_does(translator, exported, sources):
    """CTranslate2's target_prefix behind decode.prefix / prefix_file: the same greedy
    tokens as aiayn's forced search, starting with the prefix."""
    greedy = {"strategy": "greedy", "max_len_a": 1.0, "max_len_b": 10}
    torch_engine = translator.with_settings(greedy)
    ct2 = CT2Translator(exported, "cpu").with_settings(greedy)
    firsts = [t.split()[0] for t in reference_translations(torch_engine, sources)]
    prefixes = [*firsts[1:], firsts[0]]
    expected = torch_engine.translate(sources, prefixes=prefixes)
    assert ct2.translate(sources, prefixes=prefixes) == expected
    assert all(t.startswith(p) for t, p in zip(expected, prefixes, strict=True))


def test_beam_one_is_greedy_and_nbest_is_ordered(exported, sources, translator):
    ct2 = CT2Translator(exported, "cpu")
    src, _ = _collate(translator, sources)
    greedy = ct2.generate(src, ct2.decode.updated({"strategy": "greedy"}))
    beam1 = ct2.generate(src, ct2.decode.updated({"strategy": "beam", "beam_size": 1}))
    assert [h[0].tokens for h in greedy] == [h[0].tokens for h in beam1]
    nbest = ct2.generate(src, ct2.decode.updated({"strategy": "beam", "nbest": 3}))
    for hyps in nbest:
        assert len(hyps) == 3
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_replicas_sharing_a_batch_decode_as_one_translator(exported, sources, translator, strategy):
    """The CPU default: single-threaded replicas that split each batch among them give the
    same hypotheses and scores as one translator decoding the whole batch."""
    one = CT2Translator(exported, "cpu", "float32", inter_threads=1, intra_threads=1)
    two = CT2Translator(exported, "cpu", "float32", inter_threads=2, intra_threads=1)
    assert (one.engine.num_translators, two.engine.num_translators) == (1, 2)
    settings = {"strategy": strategy, "beam_size": 3, "nbest": 2 if strategy == "beam" else 1}
    src, _ = _collate(translator, sources)
    a, b = (t.with_settings(settings).generate(src) for t in (one, two))
    assert [[h.tokens for h in hyps] for hyps in a] == [[h.tokens for h in hyps] for hyps in b]
    for x, y in zip(a, b, strict=True):
        assert [h.score for h in x] == pytest.approx([h.score for h in y], abs=1e-5)
    assert two.with_settings(settings).engine is two.engine  # the replicas are kept


class _EngineWithout:
    """A CTranslate2 translator whose first decode fails as a CUDA 12 wheel does on a machine
    with CUDA 13 alone (seen on an H200), or with any other error."""

    num_translators = 1

    def __init__(self, message: str) -> None:
        self.message = message

    def translate_batch(self, *args, **kwargs):
        raise RuntimeError(self.message)


def test_a_cuda_library_that_cannot_load_is_named_with_what_to_do(exported, translator, sources):
    missing = "Library libcublas.so.12 is not found or cannot be loaded"
    ct2 = CT2Translator(exported, "cuda", engine=_EngineWithout(missing))
    with pytest.raises(ConfigError) as refused:
        ct2.translate(sources)
    message = str(refused.value)
    assert "engine=ctranslate2 on device='cuda'" in message and "libcublas.so.12" in message
    assert "device=cpu or engine=torch" in message and "nvidia-cublas-cu12" in message
    other = CT2Translator(exported, "cpu", engine=_EngineWithout("out of memory"))
    with pytest.raises(RuntimeError, match=r"^out of memory$"):  # not ours to explain
        other.translate(sources)


def test_threads_are_shared_out_as_configured(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert thread_split("cpu") == (4, 1)  # one single-threaded replica per thread
    assert thread_split("cpu", inter=2) == (2, 2)
    assert thread_split("cpu", intra=4) == (1, 4)  # CTranslate2's own way: one replica
    assert thread_split("cpu", inter=3, intra=3) == (3, 3)  # as given, even oversubscribed
    assert thread_split("cuda") == (1, 0)  # 0: CTranslate2's default
    assert [sub_batch_size(n, 4) for n in (1, 7, 8, 9)] == [1, 2, 2, 3]
    assert sub_batch_size(9, 1) == 0  # one replica: the whole batch
    with pytest.raises(ConfigError, match="ct2_intra_threads must be >= 0"):
        thread_split("cpu", intra=-1)


def test_export_carries_tokenizer_decode_settings_and_run_data(exported, ckpt, translator):
    metadata = json.loads((exported / "aiayn.json").read_text())
    assert metadata["model"]["d_model"] == translator.model.config.d_model
    assert metadata["decode"]["strategy"] == translator.decode.strategy
    assert metadata["data"]["source"] == "toy"
    assert metadata["checkpoint"] == str(ckpt.resolve())
    ct2 = CT2Translator(exported, "cpu")
    assert ct2.tokenizers.state() == translator.tokenizers.state()
    assert ct2.decode == translator.decode


def test_int8_stays_close_to_float32(exported, translator, sources):
    """int8 (quantized on load) against float32 on the same export: per-token
    log-probabilities and greedy outputs. (Its BLEU on Multi30k: experiments/.)"""
    fp32, int8 = (CT2Translator(exported, "cpu", kind) for kind in ("float32", "int8"))
    src, _ = _collate(translator, sources)
    greedy = fp32.decode.updated({"strategy": "greedy"})
    outputs = [[h[0].tokens for h in t.generate(src, greedy)] for t in (fp32, int8)]
    rows = [[fp32.src_tokens[i] for i in row if i] for row in src.tolist()]
    targets = [[fp32.tokenizers.tgt.id_to_token(i) for i in out] for out in outputs[0]]
    a, b = (t.engine.score_batch(rows, targets) for t in (fp32, int8))
    pairs = zip(a, b, strict=True)
    diffs = [abs(x - y) for r, q in pairs for x, y in zip(r.log_probs, q.log_probs, strict=True)]
    # quantized (the scores moved), yet close: this tiny model (d_model 32) is int8's worst
    # case; its BLEU on Multi30k against float32: experiments/multi30k_cpu_ct2_int8.md
    assert max(diffs) > 1e-3
    assert sum(diffs) / len(diffs) < 0.35 and max(diffs) < 2.0, diffs


def test_conversion_is_cached_outside_the_run_by_content_and_refreshed(ckpt, tmp_path, monkeypatch):
    """The conversion goes to AIAYN_CACHE_DIR/ct2/<SHA-256 of the checkpoint>, nothing beside
    the checkpoint; it is reused, shared by a copy of the same bytes, and made again when the
    checkpoint is rewritten, the conversion made from its earlier bytes dropped."""
    import hashlib

    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path / "cache"))
    run = tmp_path / "run"
    run.mkdir()
    copy = run / "last.ckpt"
    copy.write_bytes(ckpt.read_bytes())
    first = cached_export(copy)
    digest = hashlib.sha256(copy.read_bytes()).hexdigest()
    assert first == tmp_path / "cache" / "ct2" / digest and (first / "model.bin").is_file()
    assert [p.name for p in run.iterdir()] == ["last.ckpt"]
    stamp = (first / "model.bin").stat().st_mtime_ns
    assert cached_export(copy) == first and (first / "model.bin").stat().st_mtime_ns == stamp
    twin = tmp_path / "twin.ckpt"
    twin.write_bytes(copy.read_bytes())
    assert cached_export(twin) == first and (first / "model.bin").stat().st_mtime_ns == stamp
    checkpoint = torch.load(copy, weights_only=True)
    key = next(k for k in checkpoint["state_dict"] if k.endswith("output.weight"))
    checkpoint["state_dict"][key] = checkpoint["state_dict"][key] * 0.5  # a rewritten ckpt
    torch.save(checkpoint, copy)
    second = cached_export(copy)
    metadata = json.loads((second / "aiayn.json").read_text())
    assert second != first and metadata["checkpoint_sha256"] == second.name
    assert metadata["checkpoint"] == str(copy.resolve())
    assert [p.name for p in second.parent.iterdir()] == [second.name]  # the earlier one: gone
    translator = load_translator(str(copy), "cpu", engine="ctranslate2")
    assert isinstance(translator, CT2Translator) and translator.directory == second
    assert [p.name for p in run.iterdir()] == ["last.ckpt"]


@pytest.mark.slow
def test_export_and_translate_commands(ckpt, sources, translator, tmp_path):
    out, small = tmp_path / "exported", tmp_path / "int8"
    args = [f"ckpt_path={ckpt}", f"output_dir={out}", f"paths.log_dir={tmp_path}"]
    proc = cli(args, tmp_path, "aiayn.export")
    assert proc.returncode == 0, proc.stderr
    assert "float32" in proc.stdout and (out / "model.bin").is_file()
    args8 = [f"ckpt_path={ckpt}", f"output_dir={small}", "quantization=int8"]
    assert cli(args8, tmp_path, "aiayn.export").returncode == 0
    assert (small / "model.bin").stat().st_size < 0.6 * (out / "model.bin").stat().st_size
    again = cli(args, tmp_path, "aiayn.export")
    assert again.returncode == 1 and "exists" in again.stderr and "force=true" in again.stderr
    assert "Traceback" not in again.stderr

    src_file = tmp_path / "src.txt"
    src_file.write_text("".join(f"{line}\n" for line in sources), encoding="utf-8")
    common = [f"input={src_file}", f"paths.log_dir={tmp_path}", "device=cpu", "batch_size=4"]
    ours = cli([f"ckpt_path={ckpt}", *common], tmp_path, "translate.py")
    theirs = cli([*common, "engine=ctranslate2", f"ct2_path={out}"], tmp_path, "translate.py")
    assert ours.returncode == 0 and theirs.returncode == 0, theirs.stderr
    assert theirs.stdout == ours.stdout and len(ours.stdout.splitlines()) == len(sources)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["ckpt_path=x.ckpt", "ct2_path=/some/dir"], "engine=ctranslate2"),
        (["engine=onnx", "ckpt_path=x.ckpt"], "engine must be one of"),
        (["engine=ctranslate2"], "ckpt_path is required"),
        (["ckpt_path=x.ckpt", "ct2_compute_type=int4"], "ct2_compute_type"),
        (["ckpt_path=x.ckpt", "ct2_inter_threads=-2"], "ct2_inter_threads must be >= 0"),
    ],
)
def test_engine_settings_are_checked_by_name(overrides, message, tmp_path):
    with pytest.raises(CONFIG_ERRORS, match=message):
        evaluate(compose_config("eval", overrides, tmp_path))


def test_what_ctranslate2_cannot_express_is_refused_by_name(tmp_path):
    model = tiny_model(final_norm=True)  # post-norm stacks with final norms (torch's default)
    with pytest.raises(CONFIG_ERRORS, match=r"model\.final_norm=true on post-norm"):
        model_spec(model, _vocab(23), _vocab(23))
    lstm = build_model(tiny_config(arch="rnn"))
    with pytest.raises(CONFIG_ERRORS, match=r"model\.arch='rnn': decode it with engine=torch"):
        model_spec(lstm, _vocab(23), _vocab(23))


def test_export_config_and_foreign_directories_are_refused(tmp_path):
    with pytest.raises(CONFIG_ERRORS, match="output_dir are required"):
        ExportConfig(ckpt_path="x.ckpt")
    with pytest.raises(CONFIG_ERRORS, match="quantization"):
        ExportConfig(ckpt_path="x.ckpt", output_dir="d", quantization="int3")
    with pytest.raises(CheckpointError, match=r"no aiayn\.json"):
        CT2Translator(tmp_path, "cpu")


def _collate(translator, lines):
    from aiayn.data.dataset import collate_sources

    return collate_sources(translator.tokenizers.encode(lines, side="src"))
