"""Test helpers shared by every layer: compose the real config tree as the entry points do,
run a command-line tool as a user would, and read what a run wrote (CSV, W&B)."""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, open_dict

from aiayn.config import CONF_DIR, register
from aiayn.errors import ConfigError

REPO = CONF_DIR.parent
# a bad key fails while composing (the schemas are in the defaults lists), a bad value when the
# dataclasses are built (to_schema); either way the message names the key
CONFIG_ERRORS = (ConfigError, ConfigCompositionException)


def compose_with_hydra(name: str, overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """conf/<name>.yaml + overrides, schemas and resolvers registered, with its `hydra` node
    (what Hydra composes before it sets its runtime)."""
    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        return compose(name, overrides=list(overrides), return_hydra_config=True)


def compose_config(name: str, overrides: list[str], output_dir: Path | None = None) -> DictConfig:
    """conf/<name>.yaml + overrides as the entry point composes it (schemas registered,
    Hydra's runtime set so ${hydra:...} resolves), with its output in output_dir."""
    cfg = compose_with_hydra(name, overrides)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        if output_dir is not None:
            cfg.paths.output_dir = str(output_dir)
            cfg.paths.log_dir = str(output_dir / "logs")
        del cfg.hydra
    return cfg


def compose_train(overrides: list[str], output_dir: Path | None = None) -> DictConfig:
    """conf/train.yaml + overrides (see compose_config)."""
    return compose_config("train", overrides, output_dir)


def fast_overrides(tmp_path: Path) -> list[str]:
    """A tiny model on a small toy corpus: seconds per run on 2 CPU cores."""
    return [
        "model=tiny",
        "logger=csv",
        "callbacks=default",
        "~callbacks.rich_progress_bar",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        f"data.cache_dir={tmp_path / 'cache'}",
    ]


def cli(args: list[str], tmp_path: Path, module: str = "train.py", timeout: int = 600):
    """Run an entry point as a user would (`python train.py ...`) with logs under tmp_path
    (`module=""`: `args` go to python itself, e.g. `-c <code>`)."""
    import os
    import subprocess
    import sys

    # the repository ahead of what the environment's PYTHONPATH holds (on a GPU machine:
    # the carried wheels and src/, where aiayn is not installed)
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    if not module:
        command = [sys.executable]
    elif module.endswith(".py"):
        command = [sys.executable, module]
    else:
        command = [sys.executable, "-m", module]
    return subprocess.run(
        [*command, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# 60 updates with one validation at the end: enough for a tiny model's loss to fall by > 1
SIXTY_STEPS = [
    "trainer.max_steps=60",
    "trainer.max_epochs=-1",
    "trainer.val_check_interval=60",
    "trainer.check_val_every_n_epoch=null",
    "trainer.log_every_n_steps=5",
    "optim.warmup_steps=30",
]


def assert_loss_fell(losses: list[float], by: float) -> None:
    """The mean of the last three logged training losses is ``by`` below the first: one
    batch's loss depends on its sentences (short ones score higher), so no single late batch
    decides."""
    assert all(math.isfinite(loss) for loss in losses), losses
    assert sum(losses[-3:]) / 3 < losses[0] - by, losses


def cli_overrides(tmp_path: Path) -> list[str]:
    """fast_overrides for the command line, with all run directories under tmp_path."""
    return [*fast_overrides(tmp_path), f"paths.log_dir={tmp_path / 'logs'}"]


def run_dirs(tmp_path: Path) -> list[Path]:
    """The run directories (not srun's hidden `.slurm-<job>` pointers to them)."""
    runs = (tmp_path / "logs" / "train" / "runs").iterdir()
    return sorted(p for p in runs if not p.name.startswith("."))


def csv_metrics(run_dir: Path) -> dict[str, list[float]]:
    """metric name -> its logged values in order (empty cells skipped), from a run's
    csv/metrics.csv."""
    import csv

    with open(run_dir / "csv" / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    columns = rows[0].keys() if rows else []
    return {name: [float(r[name]) for r in rows if r[name]] for name in columns}


def read_wandb_records(path: Path) -> list:
    """The protobuf records of a W&B `.wandb` transaction log (LevelDB log format: a 7-byte
    ':W&B' header, then 32 KiB blocks of [crc32 4][length 2][type 1][payload] chunks)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    block, pos, records, pending = 32768, 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer too small for a header: skip it
            pos += block - pos % block
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
        elif kind == 0 and length == 0:
            break
    return records


def wandb_rows(path: Path) -> list[dict[str, object]]:
    """The rows logged with run.log() (each key -> value), in order, from a `.wandb` file."""
    import json

    return [
        {
            item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in r.history.item
        }
        for r in read_wandb_records(path)
        if r.WhichOneof("record_type") == "history"
    ]


def wandb_history(path: Path) -> dict[str, list]:
    """key -> values logged with run.log(), in order, from a `.wandb` file."""
    history: dict[str, list] = {}
    for row in wandb_rows(path):
        for key, value in row.items():
            history.setdefault(key, []).append(value)
    return history


# what differs between two runs of the same config: timings, and the resume record
TIMINGS = (
    "wall_clock_min",
    "train_tokens_per_sec",
    "train_target_tokens_per_sec",
    "train_target_tokens",  # this attempt's count: a resumed run's starts again
    "resumed_from",
    "peak_rss_mib",
    "matmul_peak_gflops",
    "mfu_peak_tflops",  # measured on a CPU
)
TIMED = ("train/elapsed_min", "train/mfu", "train/tokens_per_sec", "train/peak_rss_mib")


def reported(run: Path) -> dict:
    """metrics.json without timings and the resume record; paths relative to the run."""
    import json

    metrics = json.loads((run / "metrics.json").read_text())
    metrics["fit"] = {k: v for k, v in metrics["fit"].items() if k not in TIMED}
    text = json.dumps({k: v for k, v in metrics.items() if k not in TIMINGS})
    return json.loads(text.replace(str(run), "<run>"))


def rounded(value):
    """`value` with every float rounded to 4 decimals (dicts walked)."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


def free_port() -> int:
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


def launch(
    launcher: str,
    args: list[str],
    job: int = 1,
    timeout: int = 900,
    settle: float | None = None,
    count: int = 2,
) -> list[tuple[int, str, float]]:
    """train.py as `count` processes started the way a cluster starts them: `torchrun
    --nnodes <count> --node-rank r` (one agent per "node" on localhost), or as `srun
    --ntasks-per-node <count>` would (SLURM's variables set by hand: there is no SLURM
    here). Each one's (exit code, output, seconds it ran); one still running after `timeout`
    seconds, or `settle` seconds after the first one ended, is killed with every process
    under it (exit code -9)."""
    import os
    import sys
    import tempfile

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    commands, envs = [], []
    for rank in range(count):
        if launcher == "torchrun":
            torchrun = [
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(count),
                "--nproc-per-node",
                "1",
            ]
            torchrun += ["--node-rank", str(rank), "--master-addr", "127.0.0.1"]
            commands.append([sys.executable, *torchrun, "--master-port", str(port), "train.py"])
            envs.append(env)
        else:
            slurm = {"SLURM_JOB_ID": str(job), "SLURM_STEP_ID": "0", "SLURM_JOB_NAME": "train"}
            tasks = str(count)
            slurm |= {"SLURM_NTASKS": tasks, "SLURM_NTASKS_PER_NODE": tasks, "SLURM_NODEID": "0"}
            slurm |= {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)}
            slurm |= {"SLURM_NODELIST": "127.0.0.1", "MASTER_PORT": str(port)}
            commands.append([sys.executable, "train.py"])
            envs.append({**env, **slurm})
    with contextlib.ExitStack() as stack:  # files, not pipes: a stray child cannot hold them
        logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in commands]
        return _run_until(commands, envs, args, logs, timeout, settle)


def _run_until(commands, envs, args, logs, timeout, settle) -> list[tuple[int, str, float]]:
    import os
    import subprocess

    start = time.monotonic()
    processes = [
        subprocess.Popen(
            [*command, *args], cwd=REPO, env=rank_env, stdout=log, stderr=log, text=True
        )
        for command, rank_env, log in zip(commands, envs, logs, strict=True)
    ]
    ended: dict[int, float] = {}
    while len(ended) < len(processes) and time.monotonic() - start < timeout:
        if ended and settle is not None and time.monotonic() - start > min(ended.values()) + settle:
            break
        for i, process in enumerate(processes):
            if i not in ended and process.poll() is not None:
                ended[i] = time.monotonic() - start
        time.sleep(0.2)
    results = []
    for i, (process, log) in enumerate(zip(processes, logs, strict=True)):
        for pid in [*_descendants(process.pid), process.pid]:  # torchrun's workers too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        process.wait()
        log.seek(0)
        results.append((process.returncode, log.read(), ended.get(i, timeout)))
    return results


def _descendants(pid: int) -> list[int]:
    """Every process under `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
