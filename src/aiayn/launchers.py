"""Processes started by a launcher outside Lightning (`torchrun`, SLURM's `srun`): which one
this process is, and one run directory for all of them.

Lightning's own launcher (`trainer.devices=N` in one command) starts the other ranks itself and
hands them the first rank's run directory. Under `torchrun` or `srun` every rank starts
`train.py` on its own, and each would claim a run directory of its own (their clocks may
not even agree on the second). So global rank 0 claims the directory and publishes its name,
and the other ranks use it:

- torchrun: through the key-value store its agent hosts for the launch (`MASTER_ADDR`,
  `MASTER_PORT`), under a key per restart of the launch;
- srun: through a small file beside the run directories named after the job, step and
  restart (`.slurm-<job>.<step>.<restart>`), which needs the filesystem the run directories
  are on to be shared by the nodes, as it is on clusters (checkpoints need it too).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from aiayn.errors import ConfigError, replace_text

WAIT_SECONDS = 600  # for rank 0 to publish its run directory (it may be preparing a venv...)


@dataclass(frozen=True)
class Launch:
    """One process of a multi-process launch. kind: 'torchrun' or 'slurm'; key: the same in
    every process of this launch (and of this restart of it), different in any other."""

    kind: str
    rank: int
    world_size: int
    key: str

    def share_run_dir(self, claim: Callable[[], str], parent: Path) -> str:
        """Rank 0's `claim()` (a new directory under `parent`); every rank gets its name."""
        if self.kind == "torchrun":
            return self._share_by_store(claim, parent)
        return self._share_by_file(claim, parent)

    def _share_by_store(self, claim: Callable[[], str], parent: Path) -> str:
        from torch.distributed import TCPStore

        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            raise ConfigError(
                "torchrun without its agent's store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): "
                "the ranks cannot agree on a run directory; give every rank the same "
                "hydra.run.dir=<dir>"
            )
        store = TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=WAIT_SECONDS),
        )
        # one name per directory asked for: Hydra may resolve a run directory more than once,
        # under another parent (before and after the command line's paths.log_dir), and a
        # rank that read the first answer for the second got another run's directory
        name = f"aiayn/run_dir/{self.key}/{os.path.abspath(parent)}"
        if self.rank == 0:
            store.set(name, claim())
        return store.get(name).decode()  # waits for rank 0

    def _share_by_file(self, claim: Callable[[], str], parent: Path) -> str:
        pointer = parent / f".{self.kind}-{self.key}"
        if self.rank == 0:
            parent.mkdir(parents=True, exist_ok=True)
            replace_text(pointer, claim())
        deadline = time.monotonic() + WAIT_SECONDS
        while not pointer.is_file():
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"rank {self.rank} waited {WAIT_SECONDS} s for rank 0 to name the run "
                    f"directory in {pointer}: is {parent} on a filesystem every node shares? "
                    "If not, give every rank the same hydra.run.dir=<dir> on shared storage"
                )
            time.sleep(0.2)
        return pointer.read_text()


def external_launch() -> Launch | None:
    """This process's place in a `torchrun` or `srun` launch of several processes, else None
    (one process, or Lightning's own launcher, whose ranks get their directory from rank 0)."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env and int(env.get("WORLD_SIZE", "1")) > 1:
        restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        return Launch("torchrun", int(env["RANK"]), int(env["WORLD_SIZE"]), restart)
    interactive = env.get("SLURM_JOB_NAME") in ("bash", "interactive")  # as Lightning decides
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1 and not interactive:
        parts = (env.get(k, "0") for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT"))
        return Launch("slurm", int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), ".".join(parts))
    return None


def started_by_lightning() -> bool:
    """Whether Lightning's own launcher (`trainer.devices=N` in one command) started this
    process as one of its ranks > 0 (it sets their LOCAL_RANK; torchrun and srun are
    `external_launch`)."""
    return external_launch() is None and os.environ.get("LOCAL_RANK", "0") != "0"


def log_file(output_dir: str, job_name: str) -> str:
    """The file this process logs to in `output_dir` (Hydra's job logging): `<job_name>.log`
    for rank 0 and a single process, `<job_name>_rank<r>.log` for every other rank of a
    torchrun or srun launch, so that no two processes append to one file (on NFS or Lustre
    their lines would interleave or vanish). Lightning's own launcher names its children's
    jobs apart already."""
    launch = external_launch()
    rank = f"_rank{launch.rank}" if launch is not None and launch.rank > 0 else ""
    return f"{output_dir}/{job_name}{rank}.log"
