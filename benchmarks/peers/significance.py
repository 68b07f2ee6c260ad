"""Is a difference in the peer table's test2016 BLEU larger than the test set's sampling
noise? sacreBLEU's paired bootstrap resampling (its default 1 000 resamples of the test
sentences and its fixed seed) of each run's hypotheses, on the table's tokenized BLEU
(Moses-tokenised lowercased text, `text.py score`), against each run of a baseline system.

    MULTI30K_ROOT=<dir> python benchmarks/peers/significance.py \\
        experiments/peers/same_pipeline/*/result.json [--baseline aiayn] [--checkpoint averaged]

One row per run (its directory's name): its BLEU and the bootstrap's 95% interval (the mean
of the resamples, give or take half the width from their 2.5th to their 97.5th percentile),
then for each baseline run the difference (run minus baseline) and the p-value sacreBLEU's
paired bootstrap gives it (`sacrebleu --paired-bs`). Two runs of one system differ by their
seed and their hour as well; this test sees only the test sentences, so it says whether one
run's lead over another is more than the choice of test sentences, not that the systems
differ.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from text import read_hypotheses, root

from aiayn.inference.evaluation import moses_tokenize

SPLIT, LANG = "test2016", "de"


def hypotheses(run: Path, framework: str, checkpoint: str) -> list[str]:
    """The run's test2016 hypotheses of `checkpoint` as text (the peers write pieces)."""
    path = run / f"hyp.{checkpoint}.{SPLIT}"
    if not path.is_file():
        raise SystemExit(f"{path}: no {checkpoint} hypotheses of {SPLIT} in this run")
    return read_hypotheses(path, pieces=framework != "aiayn")  # aiayn's evaluate.py: text


def compare(runs: list[Path], baseline: str, checkpoint: str) -> str:
    """The markdown table (see the module docstring) of `runs`, the runs of `baseline`
    among them."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    frameworks = {run: json.loads((run / "result.json").read_text())["framework"] for run in runs}
    bases = [run for run in runs if frameworks[run] == baseline]
    if not bases:
        raise SystemExit(f"no run of the baseline {baseline!r} among the results given")
    references = moses_tokenize((root() / f"{SPLIT}.{LANG}").read_text().splitlines(), LANG)
    tokenized = {
        run.name: moses_tokenize(hypotheses(run, frameworks[run], checkpoint), LANG) for run in runs
    }
    for name, lines in tokenized.items():
        if len(lines) != len(references):
            raise SystemExit(f"{name}: {len(lines)} hypotheses for {len(references)} references")
    against: dict[str, dict[str, tuple[float, float]]] = {}  # baseline run -> run -> (Δ, p)
    interval: dict[str, tuple[float, float]] = {}  # run -> its bootstrap 95% interval
    score: dict[str, float] = {}
    for base in bases:
        others = [run.name for run in runs if run != base]
        systems = [(base.name, tokenized[base.name])] + [(n, tokenized[n]) for n in others]
        metric = BLEU(tokenize="none", force=True)
        _, results = PairedTest(systems, {"BLEU": metric}, [references], "bs")()
        for name, result in zip([base.name, *others], results["BLEU"], strict=True):
            score[name] = result.score
            interval.setdefault(name, (result.mean - result.ci, result.mean + result.ci))
            if name != base.name:
                delta = result.score - score[base.name]
                against.setdefault(base.name, {})[name] = (delta, result.p_value)
    header = ["run", f"{SPLIT} BLEU", "bootstrap 95% interval"]
    header += [f"Δ against {base.name} (p)" for base in bases]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for run in sorted(runs, key=lambda r: (frameworks[r] != baseline, -score[r.name], r.name)):
        low, high = interval[run.name]
        cells = [run.name, f"{score[run.name]:.2f}", f"{low:.2f}–{high:.2f}"]
        for base in bases:
            if run == base:
                cells.append("–")
            else:
                delta, p = against[base.name][run.name]
                cells.append(f"{delta:+.2f} ({p:.3f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", type=Path, nargs="+", help="the runs' result.json files")
    parser.add_argument("--baseline", default="aiayn", help="the framework compared against")
    parser.add_argument("--checkpoint", default="averaged", help="the weights scored")
    args = parser.parse_args()
    print(compare([path.parent for path in args.results], args.baseline, args.checkpoint))


if __name__ == "__main__":
    main()
