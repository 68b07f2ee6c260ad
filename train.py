"""python train.py [group=option ...] [key=value ...]   (see conf/train.yaml and README.md)"""

import hydra
from omegaconf import DictConfig

from aiayn.config import register
from aiayn.errors import exit_on_error

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
@exit_on_error
def main(cfg: DictConfig) -> float | None:
    from aiayn.training.run import objective, run

    return objective(run(cfg), cfg.optimized_metric)  # for Hydra sweepers (optuna)


if __name__ == "__main__":
    main()
