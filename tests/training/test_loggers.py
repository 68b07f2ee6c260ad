"""A resumed run's history: the CSV rows after the checkpoint are dropped, the rest replayed
into a new logger exactly as first logged (the end-to-end proof, after a SIGKILL and with W&B,
is in test_slow.py)."""

from lightning.pytorch.loggers import Logger

from aiayn.training.loggers import CSVLogger, replay


class Recording(Logger):
    """A logger that keeps what it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[dict[str, float], int | None]] = []

    name = "recording"
    version = 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.calls.append((dict(metrics), step))


def test_rows_after_the_checkpoint_are_forgotten_and_the_rest_replayed_as_logged(tmp_path):
    first = CSVLogger(tmp_path, name="csv", version="")
    logged = [
        ({"train/loss": 5.25, "epoch": 0.0}, 9),
        ({"val/loss": 4.5, "val/bleu": 1.75, "epoch": 0.0}, 12),
        ({"train/loss": 4.125, "epoch": 1.0}, 19),
        ({"val/loss": 4.0, "epoch": 1.0}, 24),  # after the checkpoint at 19
    ]
    for metrics, step in logged:
        first.log_metrics(metrics, step)
        first.save()

    resumed = CSVLogger(tmp_path, name="csv", version="")  # a resumed run in the same directory
    rows = resumed.forget_after(19)
    assert rows == [{**metrics, "step": float(step)} for metrics, step in logged[:3]]
    target = Recording()
    replay(target, rows)
    assert target.calls == logged[:3]

    resumed.log_metrics({"val/loss": 3.5, "epoch": 1.0}, 24)  # the resumed run goes on
    resumed.save()
    assert CSVLogger(tmp_path, name="csv", version="").forget_after(100)[-1] == {
        "val/loss": 3.5,
        "epoch": 1.0,
        "step": 24.0,
    }
    assert resumed.forget_after(100)[:3] == rows  # what was kept stays


def test_a_row_cut_by_a_kill_is_dropped_and_no_history_is_none(tmp_path):
    logger = CSVLogger(tmp_path, name="csv", version="")
    assert logger.forget_after(10) is None  # nothing to replay: the caller says so
    logger.log_metrics({"train/loss": 5.0, "epoch": 0}, 4)
    logger.save()
    path = tmp_path / "csv" / "metrics.csv"
    path.write_text(path.read_text() + "1,")  # the start of a row, then SIGKILL
    assert CSVLogger(tmp_path, name="csv", version="").forget_after(10) == [
        {"train/loss": 5.0, "epoch": 0.0, "step": 4.0}
    ]
    assert len(path.read_text().splitlines()) == 2  # header and the whole row: the cut one is gone
