"""benchmarks/peers/: the shared scorer and the result each peer run writes (the runs
themselves take an hour of CPU each and are recorded, not tested)."""

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

PEERS = REPO / "benchmarks" / "peers"


def _module(name):
    spec = importlib.util.spec_from_file_location(name, PEERS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pieces_join_back_into_the_text_and_score_as_evaluate_does(tmp_path):
    text = _module("text")
    assert text.join_pieces("▁zwei ▁jun ge ▁männer .") == "zwei junge männer."
    references = ["Zwei junge Männer stehen draußen.", "Ein Hund läuft im Schnee."]
    ref = tmp_path / "ref.de"
    ref.write_text("\n".join(references) + "\n")
    hyp = tmp_path / "hyp.de"
    hyp.write_text("▁zwei ▁junge ▁männer ▁stehen ▁draußen .\n▁ein ▁hund ▁läuft ▁im ▁schnee .\n")
    assert text.score(hyp, ref, "de", pieces=True)["bleu_tok"] == pytest.approx(100.0)
    hyp.write_text("▁zwei ▁junge ▁männer .\n")
    with pytest.raises(SystemExit, match="1 lines"):
        text.score(hyp, ref, "de", pieces=True)


@pytest.mark.parametrize(
    "framework, lines, updates, rate",
    [
        (
            "eole",
            [
                "Step 50/1000000; acc: 10.0; ppl: 900.00; xent: 6.80; lr: 1.0e-04; sents: 1000; "
                "bsz: 1900/1800/40; 3000/2800 tok/s; 30 sec;",
                "Step 100/1000000; acc: 20.0; ppl: 400.00; xent: 6.00; lr: 3.0e-04; sents: 900; "
                "bsz: 1900/1800/40; 3200/3000 tok/s; 60 sec;",
            ],
            100,
            2900.0,
        ),
        (
            "fairseq",
            [
                "2026-11-26 06:04:42 | INFO | train | epoch 001 | loss 12.94 | ppl 7416.88 | "
                "wps 1500.5 | ups 1.02 | wpb 1758.8 | num_updates 50 | lr 6e-05",
                "2026-11-26 06:04:50 | INFO | valid | epoch 001 | loss 11.9 | wps 5900.1",
                "2026-11-26 06:05:42 | INFO | train | epoch 002 | loss 11.1 | wps 1600.5 | "
                "num_updates 100 | lr 6e-05",
            ],
            100,
            1550.5,
        ),
    ],
)
def test_a_peer_result_reads_updates_and_target_rate_from_the_peers_own_log(
    tmp_path, framework, lines, updates, rate
):
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    (tmp_path / "train.time").write_text("\tMaximum resident set size (kbytes): 1048576\n")
    (tmp_path / "stages.tsv").write_text("text\t20\ntrain\t3300\ntest\t90\n")
    args = ["--framework", framework, "--setting", "same", "--alpha", "1.5", "--val", "33.1"]
    args += ["--test", "35.2", "--smoke", "0"]
    done = subprocess.run(
        [sys.executable, str(PEERS / "result.py"), str(tmp_path), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads((tmp_path / "result.json").read_text())
    assert json.loads(done.stdout) == result
    assert (result["updates"], result["target_tokens_per_sec"]) == (updates, rate)
    assert result["peak_rss_mib"] == 1024 and result["stages_s"]["train"] == 3300
    assert (result["alpha"], result["val_bleu_tok"], result["test_bleu_tok"]) == (1.5, 33.1, 35.2)
