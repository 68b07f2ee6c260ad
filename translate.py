"""python translate.py ckpt_path=... [input=<file|->] [output=<file|->] [decode=beam]
(conf/translate.yaml)"""

import hydra
from omegaconf import DictConfig

from aiayn.config import register
from aiayn.errors import exit_on_error

register()


@hydra.main(version_base="1.3", config_path="conf", config_name="translate")
@exit_on_error
def main(cfg: DictConfig) -> None:
    from aiayn.inference.translate import run

    run(cfg)


if __name__ == "__main__":
    main()
