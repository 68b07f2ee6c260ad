"""Training: the LightningModule (`module`), its loss and learning-rate schedules, the
checkpoint writer, loggers, and `run` (what `python train.py` does). Imports nothing here, so
that `aiayn.training.schedules` (a schema) stays cheap to import."""
