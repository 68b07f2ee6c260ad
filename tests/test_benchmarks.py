"""The benchmark scripts whose tables `benchmarks/RESULTS.md` records run end to end, on tiny
sizes, and print tables whose ratios follow from their own rates (speed itself is never
asserted). A script that crashes, or prints a ratio that is not what its columns say, fails
here instead of when someone reruns a record."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import cli

pytestmark = pytest.mark.slow

pytest.importorskip("transformers")  # the peers: pip install -e ".[bench]" (dev has it)
pytest.importorskip("ctranslate2")

SMALL_DECODE = ["--d-model", "32", "--heads", "2", "--layers", "1", "--ffn", "64"]
SMALL_DECODE += ["--vocab", "100", "--batch-size", "4", "--src-len", "5", "--new-tokens", "3"]
SMALL_DECODE += ["--repeats", "1"]
SMALL_BATCH = ["--batch-size", "4", "--src-len", "6", "--tgt-len", "6", "--vocab", "200"]


def run(tmp_path: Path, script: str, *args: str) -> str:
    """Standard output of `python benchmarks/<script> <args>` run from the repository root."""
    done = cli(list(args), tmp_path, module=f"benchmarks/{script}")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def rows(output: str, first: str) -> list[list[str]]:
    """The cells of each table row of `output` whose first cell starts with `first`."""
    found = []
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].startswith(first):
            found.append(cells)
    return found


def number(cell: str) -> float:
    return float(re.sub(r"[x%]$", "", cell))


def test_train_speed_prints_the_peers_and_the_ratios_of_its_rates(tmp_path):
    args = [*SMALL_BATCH, "--repeats", "1", "--shapes", "tiny", "--sdpa", "math"]
    out = run(tmp_path, "train_speed.py", *args)
    assert "matmul peak" in out and "attention: math" in out  # every model pinned to it
    assert "MFU peak (float32, mfu_peak)" in out and "GFLOP/s, measured" in out  # a CPU's
    row = rows(out, "tiny")[0]  # the float32 table (a bf16 one follows where bf16 is native)
    ours, marian, plain = (number(cell) for cell in row[1:4])
    assert min(ours, marian, plain) > 0
    assert number(row[4]) == pytest.approx(ours / marian, rel=0.01, abs=0.006)  # rates rounded
    assert number(row[5]) == pytest.approx(ours / plain, rel=0.01, abs=0.006)
    assert 0 < number(row[6]) <= 100  # MFU, %


def test_profile_step_prints_each_phase_and_their_sum(tmp_path):
    out = run(
        tmp_path, "profile_step.py", "--shape", "tiny", "--steps", "1", "--rows", "3", *SMALL_BATCH
    )
    line = next(line for line in out.splitlines() if line.startswith("forward and loss"))
    parts = [float(x) for x in re.findall(r"(?:loss|backward|step) ([\d.]+)", line)]
    total = float(re.search(r"sum ([\d.]+)", line).group(1))
    assert len(parts) == 3 and total == pytest.approx(sum(parts), abs=0.15)
    assert "dropout 0.1" in out and "Self CPU time total" in out  # the profiler's table follows


@pytest.mark.parametrize("beams", ["1", "4"])
def test_profile_decode_prints_each_phase_of_its_best_call(tmp_path, beams):
    out = run(tmp_path, "profile_decode.py", "--beams", beams, "--repeats", "1", "--rows", "3")
    best = float(re.search(r"best of 1 ([\d.]+) ms", out).group(1))
    line = next(line for line in out.splitlines() if line.startswith("encoder"))
    seconds = {name: float(ms) for name, ms in re.findall(r"(\w[\w ]*?) (-?[\d.]+) ms", line)}
    names = ["encoder", "decoder layers", "output layer", "cache reorders", "the rest"]
    assert list(seconds) == names
    assert all(seconds[name] > 0 for name in names[:3])  # each one timed
    assert seconds["cache reorders"] > 0 if beams == "4" else seconds["cache reorders"] == 0
    assert seconds["the rest"] >= 0  # the phases do not overlap
    assert sum(seconds.values()) == pytest.approx(best, abs=0.3)  # each printed with one decimal
    assert "Self CPU time total" in out  # the profiler's table follows


def test_kernels_prints_each_alternative_beside_aiayns_choice(tmp_path):
    out = run(tmp_path, "kernels.py", "--repeats", "1", "--updates", "1")
    kernels = ("copy", "log-sum-exp", "dropout", "bf16 attention", "output projection")
    kernels += ("decode-step product", "output layer + loss")
    from aiayn.kernels.linear import PACKING

    if PACKING:  # then whole decode calls, packed and not (`kernels.decode_calls`)
        kernels += ("decode_speed's greedy", "decode_speed's beam")
    for first in kernels:
        assert rows(out, first), first
        for row in rows(out, first):
            a, b = (float(re.search(r"([\d.]+) ms", cell).group(1)) for cell in row[1:3])
            assert number(row[3]) == pytest.approx(a / b, rel=0.02, abs=0.006)  # a, b rounded
    from aiayn.kernels.machine import bf16_native

    precisions = 2 if bf16_native() else 1  # fp32, and bf16-mixed where bf16 is native
    assert len(rows(out, "output layer + loss")) == 3 * precisions  # the shapes' widths
    updates = [row for row in rows(out, "") if row[0] in ("tiny", "small", "base")]
    # dropout, then the logits in each precision
    assert [row[0] for row in updates] == ["tiny", "small", "base"] * (1 + precisions)
    for row in updates:  # tokens per second, the alternative's then aiayn's
        assert number(row[3]) == pytest.approx(number(row[2]) / number(row[1]), rel=0.01, abs=0.006)


def test_decode_speed_prints_every_engine_and_the_ratios_of_its_rates(tmp_path):
    # 6 sentences in batches of 4: the second table's sorted into a batch of 4, then one of 2
    out = run(tmp_path, "decode_speed.py", *SMALL_DECODE, "--sentences", "6")
    assert "6 sentences in batches of 4" in out
    assert "varied lengths: sentence i decodes its own L_i steps" in out
    assert "sorted by length into batches of 4" in out
    for strategy in ("greedy", "beam 4"):
        fixed, varied = rows(out, strategy)  # every sentence the same length, then its own
        aiayn, _, _, int8, hf = (number(cell) for cell in fixed[1:6])
        assert number(fixed[6]) == pytest.approx(aiayn / hf, rel=0.01, abs=0.006)
        assert number(fixed[7]) == pytest.approx(int8 / hf, rel=0.01, abs=0.006)
        aiayn, hf = number(varied[1]), number(varied[2])
        assert number(varied[3]) == pytest.approx(aiayn / hf, rel=0.01, abs=0.006)


def test_decode_speed_refuses_cuda_without_a_gpu_in_one_line(tmp_path):
    # this layer hides CUDA GPUs (conftest), so torch sees none, as on CI
    done = cli(["--device", "cuda", *SMALL_DECODE], tmp_path, module="benchmarks/decode_speed.py")
    assert done.returncode == 2, done.stderr[-3000:]  # argparse's usage error
    assert "Traceback" not in done.stderr and not done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last == "decode_speed.py: error: --device cuda: torch sees no CUDA GPU here"


def test_decode_speed_shape_base_is_the_papers_base_and_a_flag_beside_it_wins(tmp_path):
    code = (
        "import sys; sys.path.insert(0, 'benchmarks'); "
        "import decode_speed as d; a = d.arguments('x', devices=True); "
        "print(a.d_model, a.heads, a.layers, a.ffn, a.vocab, a.sentences, a.device)"
    )
    done = cli(["-c", code, "--shape", "base", "--layers", "2"], tmp_path, module="")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["512", "8", "2", "2048", "37000", "32", "cpu"]


def test_ct2_settings_prints_each_setting_against_hf(monkeypatch, tmp_path):
    # a CTranslate2 variable in the shell must not reach the rows that do not set it: on an
    # x86 CPU this one makes CTranslate2 refuse to load ("Invalid CPU ISA: NEON")
    monkeypatch.setenv("CT2_FORCE_CPU_ISA", "NEON")
    out = run(tmp_path, "ct2_settings.py", *SMALL_DECODE)
    hf = [float(x) for x in re.findall(r"([\d.]+) \((?:greedy|beam 4)\)", out)]
    table = [row for row in rows(out, "") if re.fullmatch(r"\d+ x \d+", row[1])]
    labels = [row[0] for row in table]
    assert labels[:4] == [
        "as aiayn ships",
        "CTranslate2's default: 1 replica",
        labels[2],
        labels[3],
    ]
    assert "CT2_PACKED_GEMM=0" in labels and any(x.startswith("CT2_USE_MKL=") for x in labels)
    for row in table:
        for rate, ratio, reference in zip(row[2::2], row[3::2], hf, strict=True):
            assert number(ratio) == pytest.approx(number(rate) / reference, rel=0.01, abs=0.006)
