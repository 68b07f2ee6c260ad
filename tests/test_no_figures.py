"""No measured figure in code or YAML comments: timings, throughputs, speed-ups, scores and the
CPU models they were measured on go stale where they are written beside code. Say why in
words and point to the record (`experiments/`, `benchmarks/RESULTS.md`). Figures quoted
from the paper or a published result are allowed where they say so."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIGURE = re.compile(
    r"""(
        \b\d+(?:\.\d+)?\s?(?:ms|µs|ns)\b                                   # a duration
      | \b\d+(?:[.,\s]\d+)?\s?(?:[GT]FLOP/s|[GT]B/s|tok/s|tokens/s|it/s|sentences/s)  # a rate
      | \b\d+(?:\.\d+)?\s?[x×]\s(?:faster|slower)                           # a speed-up
      | \b\d+\.\d+x\b
      | \b\d+\.\d+\s?(?:BLEU|s\b|seconds|minutes|min\b(?!\()|%)               # a score, a time
      | \b\d{1,2}:\d\d\b                                                    # a wall clock
      | \bEPYC\b|\bXeon\b|Sapphire\sRapids                                  # a CPU measured on
    )""",
    re.X,
)
# (file, words of the line): figures of the paper or of a published result, said to be
ALLOWED = [
    ("conf/experiment/multi30k_tiny.yaml", "the small-model recipe behind the 41.0 BLEU"),
    ("conf/experiment/paper_base.yaml", "on 8 P100s, 0.4 s per update"),
    ("conf/experiment/paper_base.yaml", "(1 500 updates at 0.4 s)"),
    ("conf/experiment/paper_big.yaml", "on 8 P100s, 1.0 s per update"),
    ("conf/experiment/paper_big.yaml", "(600 updates at 1.0 s)"),
    ("tests/training/test_configs.py", "at 0.4 / 1.0 s per update on 8 P100s"),
    ("tests/training/test_table3.py", "# paper: "),
]


def comment_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of each comment and docstring line of a .py or .yaml file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".yaml":
        return [
            (n, line[line.index("#") :])
            for n, line in enumerate(text.splitlines(), 1)
            if "#" in line
        ]
    lines = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        docstring = token.type == tokenize.STRING and token.string.lstrip("rbuRBU")[:3] in (
            '"""',
            "'''",
        )
        if token.type == tokenize.COMMENT or docstring:
            lines += [
                (token.start[0] + i, line) for i, line in enumerate(token.string.splitlines())
            ]
    return lines


def figures(path: Path) -> list[str]:
    name = path.relative_to(REPO).as_posix()
    found = []
    for number, line in comment_lines(path):
        match = FIGURE.search(line)
        if match and not any(name == f and words in line for f, words in ALLOWED):
            found.append(f"{name}:{number}: {match.group(0)!r} in {line.strip()}")
    return found


def checked_files() -> list[Path]:
    globs = ("src/**/*.py", "benchmarks/*.py", "*.py", "conf/**/*.yaml", "tests/**/*.py")
    return sorted({p for g in globs for p in REPO.glob(g) if p.name != Path(__file__).name})


@pytest.mark.parametrize(
    "line",
    [
        "# a copy took 11 ms into fresh pages",
        '"""runs at 218 GFLOP/s in MKL"""',
        "# 1.4-1.6x faster at 32 rows",
        "# 37.45 BLEU on test2016",
        "# on a 2-core Xeon two threads decoded at half the speed",
        "# in 55:40 for the whole command",
    ],
)
def test_the_check_finds_a_measured_figure(line, tmp_path):
    path = REPO / "tests" / "planted.py"
    try:
        path.write_text(f"{line}\n")
        assert figures(path), line
    finally:
        path.unlink()


def test_no_measured_figure_in_code_or_yaml_comments():
    found = [f for path in checked_files() for f in figures(path)]
    assert not found, "measured figures in comments (say it in words, cite the record):\n" + (
        "\n".join(found)
    )
    assert all((REPO / f).is_file() for f, _ in ALLOWED)
