"""experiments/multi30k_cpu_levers_sockeye/lever.sh: the length-penalty search, with
`python evaluate.py` faked (a lever's run is half an hour of CPU and is recorded)."""

import os
import subprocess
import sys

from tests.helpers import REPO

LEVER = REPO / "experiments" / "multi30k_cpu_levers_sockeye" / "lever.sh"

# `python`: evaluate.py writes the BLEU this table gives its split and length penalty; any
# other command is the real interpreter
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = evaluate.py ]; then
  for a in "$@"; do case $a in
    split=*) split=${{a#*=}};;
    decode.length_penalty=*) lp=${{a#*=}};;
    hydra.run.dir=*) dir=${{a#*=}};;
  esac; done
  mkdir -p "$dir"
  bleu=$(awk -F'\\t' -v s="$split" -v a="$lp" '$1 == s && $2 == a {{print $3}}' {table})
  echo "{{\\"bleu_tok\\": $bleu}}" > "$dir/bleu.json"; exit 0
fi
exec {python} "$@"
"""


def _score_only(tmp_path, bleu: dict[tuple[str, str], float]) -> str:
    """SCORE_ONLY=1 lever.sh on a faked trained run -> its scores.tsv."""
    table = tmp_path / "bleu.tsv"
    table.write_text("".join(f"{s}\t{a}\t{b}\n" for (s, a), b in bleu.items()))
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text(FAKE_PYTHON.format(table=table, python=sys.executable))
    fake.chmod(0o755)
    run = tmp_path / "lev" / "x"
    (run / "run" / "checkpoints").mkdir(parents=True)
    (run / "run" / "checkpoints" / "averaged.ckpt").touch()
    (run / "overrides.txt").touch()
    (run / "scores.tsv").write_text("val\t1.0\t1\n")  # an earlier scoring: replaced
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "LEVERS": str(run.parent)}
    env |= {"SCORE_ONLY": "1", "MULTI30K_ROOT": str(tmp_path)}
    subprocess.run(["bash", str(LEVER), "x"], cwd=REPO, env=env, check=True)
    assert (run / "rescored").exists() and not (run / "done").exists()
    return (run / "scores.tsv").read_text()


def test_val_chooses_alpha_past_the_grid_while_the_last_is_best_and_test_uses_it(tmp_path):
    val = {"1.0": 30, "1.5": 31, "2.0": 32, "2.5": 33, "3.0": 32.5, "3.5": 40}
    bleu = {("val", a): b for a, b in val.items()} | {("test", "2.5"): 29, ("test", "2.0"): 99}
    scores = _score_only(tmp_path, bleu)
    assert scores == (
        "val\t1.0\t30\nval\t1.5\t31\nval\t2.0\t32\nval\t2.5\t33\nval\t3.0\t32.5\ntest\t2.5\t29\n"
    )


def test_a_best_alpha_inside_the_grid_tries_no_other(tmp_path):
    bleu = {("val", "1.0"): 30, ("val", "1.5"): 33, ("val", "2.0"): 32, ("test", "1.5"): 31}
    scores = _score_only(tmp_path, bleu)
    assert scores == "val\t1.0\t30\nval\t1.5\t33\nval\t2.0\t32\ntest\t1.5\t31\n"
