"""`aiayn train [group=option ...] [key=value ...]` (also `python train.py`): train, validate
and test a model (conf/train.yaml; schema `aiayn.config.TrainConfig`)."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from aiayn.config import CONF_DIR, TrainConfig, check_command_line, register
from aiayn.errors import SweepStopped, exit_if_jobs_failed, exit_on_error

register()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
@exit_on_error
def train(cfg: DictConfig) -> float | None:
    from aiayn.training.sweep_resume import resume_job

    # resume_sweep: a finished job's metrics; a stopped one resumes. Checked before the
    # training stack is imported, so a misused resume_sweep is refused at once.
    kept = resume_job(cfg)
    from aiayn.training.run import objective, run

    metrics = kept if kept is not None else run(cfg)
    return objective(metrics, cfg.optimized_metric)  # for Hydra sweepers (optuna)


def main() -> None:
    exit_on_error(check_command_line)(sys.argv[1:], TrainConfig)
    try:
        train()
    except SweepStopped as stop:  # a signal stopped a multirun's job: the sweep ends there
        print(f"error: {stop}", file=sys.stderr, flush=True)
        sys.exit(stop.exit_code)
    exit_if_jobs_failed()  # a multirun's jobs all ran; say which failed


if __name__ == "__main__":
    main()
