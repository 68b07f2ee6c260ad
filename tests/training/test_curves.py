"""`python -m aiayn.cli.curves`: validation curves of one or several runs from their CSV
history, against wall-clock minutes."""

from pathlib import Path

import pytest

from aiayn.cli.curves import main, validation_curve


def _run(directory: Path, rows: list[str]) -> Path:
    (directory / "csv").mkdir(parents=True)
    header = "epoch,step,train/elapsed_min,train/loss,val/loss,val/bleu"
    (directory / "csv" / "metrics.csv").write_text("\n".join([header, *rows]) + "\n")
    return directory


def test_two_runs_are_overlaid_and_their_tables_printed(tmp_path, capsys):
    a = _run(tmp_path / "transformer", ["0,9,0.5,5.0,,", "0,10,,,4.0,12.5", "1,19,1.5,3.0,,"])
    b = _run(tmp_path / "rnn", ["0,9,0.25,5.5,,", "0,10,,,4.5,10.0", "1,20,,,3.5,"])
    assert validation_curve(b) == [
        {"step": 10, "minutes": 0.25, "val/loss": 4.5, "val/bleu": 10.0},
        {
            "step": 20,
            "minutes": 0.25,
            "val/loss": 3.5,
            "val/bleu": pytest.approx(float("nan"), nan_ok=True),
        },
    ]
    output = tmp_path / "both.png"
    main([str(a), str(b), "-o", str(output)])
    printed = capsys.readouterr().out
    assert "transformer\n| step |" in printed and "rnn\n| step |" in printed
    assert "| 10 | 0.5 | 4.000 | 12.50 |" in printed and "| 10 | 0.2 | 4.500 | 10.00 |" in printed
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and output.stat().st_size > 10_000


def test_a_run_without_csv_history_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path)])
    assert exit_info.value.code == 1
    assert "logger=csv" in capsys.readouterr().err


@pytest.mark.parametrize(
    "rows, args, words",
    [
        (["0,10,,,abc,12.5"], [], "metrics.csv, line 2: column val/loss holds 'abc', not a number"),
        (["0,9,soon,5.0,,", "0,10,,,4.0,"], [], "line 2: column train/elapsed_min holds 'soon'"),
        (["0,10,,,4.0,12.5"], ["-o", "{dir}/curves.txt"], "cannot write a .txt picture"),
    ],
    ids=["a damaged cell", "a damaged minute", "a file type matplotlib lacks"],
)
def test_a_damaged_history_or_an_unknown_picture_type_is_one_line(
    rows, args, words, tmp_path, capsys
):
    run = _run(tmp_path / "run", rows)
    with pytest.raises(SystemExit) as exit_info:
        main([str(run), *[a.format(dir=tmp_path) for a in args]])
    assert exit_info.value.code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and words in line
    assert not (tmp_path / "curves.txt").exists() and not (run / "curves.png").exists()
