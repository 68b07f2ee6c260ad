"""Slow end-to-end runs: resume after SIGKILL, DDP on two CPU processes, multirun + sweep
summary, W&B offline runs. Run with `python -m pytest -m slow`."""

import json
import re
import signal

import pytest
import torch

from tests.helpers import (
    REPO,
    TIMED,
    cli,
    cli_overrides,
    csv_metrics,
    launch,
    read_wandb_records,
    reported,
    rounded,
    run_dirs,
    wandb_rows,
)

pytestmark = pytest.mark.slow

TOY = ["data.toy.train_size=1500", "data.toy.val_size=60", "data.toy.test_size=60"]


def _weights(checkpoint) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _epoch_batches(cache, max_tokens: int) -> int:
    from aiayn.data.dataset import SplitDataset

    (split_dir,) = cache.glob("toy-en-de-*")
    return len(SplitDataset(split_dir, "train").batch_plan(max_tokens))


@pytest.mark.parametrize(
    "where", ["mid_epoch", "epoch_end", "validation", "ddp", "ddp_accumulated"]
)
def test_resume_after_sigkill_equals_an_uninterrupted_run(where, tmp_path):
    """Killed right after step N (after its last.ckpt), resumed from last.ckpt to 2N: the
    same weights as a run that never stopped (dropout on, so the RNG state matters; mid-epoch,
    so the data position matters; at an epoch end, so the epoch boundary does). The resumed
    run continues in the same run directory. ``ddp_accumulated``: 2 micro-batches an update
    on each of 2 ranks, a validation due after the 5th batch (inside update 3): its last.ckpt
    waits for the update's end, so the resume loses no micro-batch's gradients."""
    common = [*TOY, "trainer.max_epochs=-1", "data.max_tokens=512", "model.dropout=0.2"]
    if where in ("mid_epoch", "validation", "ddp", "ddp_accumulated"):
        n = {"ddp": 7, "ddp_accumulated": 3, "validation": 5}.get(where, 13)
        # a toy epoch has more than 13 batches (7 per rank); validation: killed in the
        # validation at 2n, resumes from n and ends at 3n
        every = 5 if where == "ddp_accumulated" else n  # batches, not updates
        common += [f"trainer.val_check_interval={every}", "trainer.check_val_every_n_epoch=null"]
        if where.startswith("ddp"):  # each rank restores its own RNG state and data position
            common += ["trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp"]
        if where == "ddp_accumulated":
            common += ["trainer.accumulate_grad_batches=2", "trainer.log_every_n_steps=1"]
    else:
        prepare = cli([*cli_overrides(tmp_path), *common, "train=false", "test=false"], tmp_path)
        assert prepare.returncode == 0, prepare.stderr[-3000:]
        n = _epoch_batches(tmp_path / "cache", 512)  # validation + last.ckpt at each epoch end
    end = 3 * n if where == "validation" else 2 * n
    common += [f"trainer.max_steps={end}", "test=false"]
    if where == "mid_epoch":  # W&B (offline) beside the CSV history
        common += ["logger=wandb"]
    if where == "validation":  # all loggers, records in the run directory (attention maps),
        # and an average of 3 snapshots, one from before the kill (steps 5, 10, 15)
        common += ["logger=many", "callbacks=[default,attention,average]"]
        common += ["callbacks.average.last=3"]
    straight = tmp_path / "straight"
    result = cli([*cli_overrides(straight), *common], straight)
    assert result.returncode == 0, result.stderr[-3000:]

    killed = tmp_path / "killed"
    args = [*cli_overrides(killed), *common]
    killer = "KillInValidationAt" if where == "validation" else "KillAtStep"
    kill = [
        f"+callbacks.kill._target_=tests.training.callbacks.{killer}",
        f"+callbacks.kill.step={2 * n if where == 'validation' else n}",
    ]
    result = cli([*args, *kill], killed)
    # under DDP a rank may see its peer die first and fail on its own, before its SIGKILL
    ddp = where.startswith("ddp")
    assert result.returncode == -signal.SIGKILL or ddp, result.stderr[-3000:]
    assert result.returncode != 0
    (run,) = run_dirs(killed)
    last = run / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == n

    result = cli([*args, f"ckpt_path={last}"], killed)
    assert result.returncode == 0, result.stderr[-3000:]
    assert run_dirs(killed) == [run]  # continued in place
    straight_ckpt = run_dirs(straight)[0] / "checkpoints" / "last.ckpt"
    assert torch.load(straight_ckpt, weights_only=True)["global_step"] == end
    assert torch.load(last, weights_only=True)["global_step"] == end
    assert _max_diff(_weights(straight_ckpt), _weights(last)) <= 1e-6
    assert json.loads((run / "metrics.json").read_text())["resumed_from"] == str(last)
    steps = csv_metrics(run)["step"]  # history kept, appended
    assert min(steps) < n < max(steps)
    # everything the run reports is the uninterrupted run's: the best checkpoint, the
    # metrics file (timings and the resume record aside) and the logged history
    straight_run = run_dirs(straight)[0]
    best_a, best_b = (r / "checkpoints" / "best.ckpt" for r in (straight_run, run))
    load = lambda p: torch.load(p, weights_only=True)  # noqa: E731
    assert load(best_a)["global_step"] == load(best_b)["global_step"]
    assert _max_diff(_weights(best_a), _weights(best_b)) <= 1e-6
    assert rounded(reported(straight_run)) == rounded(reported(run))
    for metric in ("val/loss", "val/bleu", "train/loss", "train/lr"):
        a, b = csv_metrics(straight_run)[metric], csv_metrics(run)[metric]
        assert a == pytest.approx(b, abs=1e-5), metric
    if where == "validation":  # the average takes up the snapshot written before the kill
        avg_a, avg_b = (r / "checkpoints" / "averaged.ckpt" for r in (straight_run, run))
        assert load(avg_b)["averaged_from"] == ["step 5", "step 10", "step 15"]
        assert load(avg_a)["averaged_from"] == load(avg_b)["averaged_from"]
        assert _max_diff(_weights(avg_a), _weights(avg_b)) <= 1e-6
        assert not list((run / "checkpoints").glob(".snapshot-*"))  # deleted once averaged
    elapsed = csv_metrics(run)["train/elapsed_min"]  # the curves' x axis continues
    assert elapsed == sorted(elapsed)
    if "logger=many" in common:  # TensorBoard shows the uninterrupted run's scalars
        a, b = (
            _tensorboard(r, ("train/loss", "val/loss", "val/bleu")) for r in (straight_run, run)
        )
        assert a.keys() == b.keys() and all(a.values())
        for tag in a:
            assert [s for s, _ in a[tag]] == [s for s, _ in b[tag]], tag
            assert [v for _, v in a[tag]] == pytest.approx([v for _, v in b[tag]], abs=1e-5)
    if {"logger=wandb", "logger=many"} & set(common):  # the new W&B run holds the whole history
        logs = sorted(run.glob("wandb/*run-*/run-*.wandb"))  # the killed run's, the resumed
        assert len(logs) == 2
        (straight_log,) = straight_run.glob("wandb/*run-*/run-*.wandb")
        a, b = (_wandb_series(wandb_rows(log)) for log in (straight_log, logs[-1]))
        assert a.keys() == b.keys() and "val/bleu" in a and "train/loss" in a
        for metric in a:  # scalars, and the sample tables and attention images as files
            assert [s for s, _ in a[metric]] == [s for s, _ in b[metric]], metric
            if metric.startswith("attention/"):  # PNGs of maps equal to 1e-6, not bit for bit
                continue
            assert [v for _, v in a[metric]] == pytest.approx([v for _, v in b[metric]], abs=1e-5)
        samples = [(run / "samples.jsonl").read_text() for run in (straight_run, run)]
        assert samples[0] == samples[1]
        if where == "validation":
            drawn = [sorted(p.name for p in r.glob("attention/step*")) for r in (straight_run, run)]
            assert drawn[0] == drawn[1] and len(drawn[0]) == 3


def _tensorboard(run, tags) -> dict[str, list[tuple[int, float]]]:
    """tag -> (step, value) of a run's TensorBoard events as TensorBoard shows them (events a
    resumed writer purged are gone)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    return {t: [(e.step, e.value) for e in events.Scalars(t)] for t in tags}


def _wandb_series(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """metric -> its (update, value) points in a W&B history, timings and W&B's own aside."""
    names = {k for row in rows for k in row if not k.startswith("_") and k not in TIMED}
    names = {k for k in names if "path" not in k.rsplit("/", 1)[-1]}  # W&B's media file names
    names.discard("trainer/global_step")
    return {k: [(r["trainer/global_step"], r[k]) for r in rows if k in r] for k in names}


def test_resume_with_a_different_model_is_refused_before_any_work(tmp_path):
    result = cli([*cli_overrides(tmp_path), *TOY, "trainer.max_steps=2"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    result = cli(
        [*cli_overrides(tmp_path), *TOY, f"ckpt_path={last}", "model.num_heads=2"], tmp_path
    )
    assert result.returncode != 0
    assert "model.num_heads=4" in result.stderr and "model.num_heads=2" in result.stderr
    record = {p: p.read_bytes() for p in [*run.glob(".hydra/*.yaml"), run / "tokenizer.json"]}
    other = [f"ckpt_path={last}", "data.tokenizer.vocab_size=300"]  # another tokenizer
    result = cli([*cli_overrides(tmp_path), *TOY, *other], tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "trained with another tokenizer" in result.stderr
    for path, content in record.items():  # the original run's record is as it was
        assert path.read_bytes() == content, path
    assert len(record) == 4  # config, hydra, overrides, tokenizer


# 1600 pairs make an even number of batches, so the sampler splits none for 2 ranks and a
# 2-rank run cuts the very same batch list as one process accumulating 2 batches
DDP_COMMON = [
    "data.toy.train_size=1600",
    "data.toy.val_size=60",
    "data.toy.test_size=60",
    "trainer.max_steps=12",
    "trainer.max_epochs=-1",
    "trainer.check_val_every_n_epoch=null",
    "optim.warmup_steps=50",
    "model.dropout=0.0",
    "data.max_tokens=512",
    "trainer.accelerator=cpu",
    "test=false",
    "val_bleu=false",
    "callbacks.model_checkpoint.monitor=val/loss",
    "callbacks.model_checkpoint.mode=min",
]
# val_check_interval counts batches: 12 batches of one process = 6 updates of two
ONE_PROCESS = ["trainer.accumulate_grad_batches=2", "trainer.val_check_interval=12"]


def _assert_close_weights(one, two) -> None:
    """Equal up to float summation order, which Adam's early sign-like steps amplify on
    near-zero gradients: the weights compared as a whole, not element by element."""
    wa, wb = _weights(one), _weights(two)
    diff = torch.cat([(wa[k] - wb[k]).flatten() for k in wa]).norm()
    assert diff / torch.cat([wa[k].flatten() for k in wa]).norm() < 1e-2


def test_ddp_two_cpu_processes_match_one_process_with_the_same_global_batch(tmp_path):
    """gloo DDP on 2 processes vs 1 process accumulating 2 batches: rank r takes batches
    r, r+2, ... so both see the same global batch per update; weights and val/loss agree."""
    common = DDP_COMMON
    one = tmp_path / "one"
    result = cli([*cli_overrides(one), *common, *ONE_PROCESS], one)
    assert result.returncode == 0, result.stderr[-3000:]
    two = tmp_path / "two"
    two_args = ["trainer.devices=2", "trainer.strategy=ddp", "trainer.val_check_interval=6"]
    result = cli([*cli_overrides(two), *common, *two_args], two)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "distributed_backend=gloo" in result.stdout + result.stderr
    assert "Starting with 2 processes" in result.stdout + result.stderr
    (run_one,) = run_dirs(one)
    (run_two,) = run_dirs(two)
    _assert_same_batches_for_one_and_two_ranks(one / "cache")
    _assert_close_weights(
        run_one / "checkpoints" / "last.ckpt", run_two / "checkpoints" / "last.ckpt"
    )

    la, lb = csv_metrics(run_one)["val/loss"], csv_metrics(run_two)["val/loss"]
    assert len(la) == len(lb) == 2
    assert la == pytest.approx(lb, rel=2e-3)
    assert la[1] < la[0] - 0.2  # and the runs did learn: the comparison is not vacuous


def _assert_same_batches_for_one_and_two_ranks(cache):
    from aiayn.data.dataset import SplitDataset
    from aiayn.data.sampler import TokenBatchSampler

    (split_dir,) = cache.glob("toy-en-de-*")
    plan = SplitDataset(split_dir, "train").batch_plan(512)
    single = TokenBatchSampler(plan, True, seed=1234, rank=0, world_size=1)
    ranks = [TokenBatchSampler(plan, True, 1234, r, 2) for r in (0, 1)]
    interleaved = [b for pair in zip(*ranks, strict=True) for b in pair]
    assert list(single) == interleaved


def test_multirun_six_jobs_and_the_sweep_summary(tmp_path):
    """`train.py -m model.num_heads=1,4,8 model.norm_first=false,true`: six jobs, each in its
    own directory with its own W&B offline run; `aiayn.sweeps` tabulates and plots them."""
    result = cli(
        [
            "-m",
            *cli_overrides(tmp_path),
            *TOY,
            "model.num_heads=1,4,8",
            "model.norm_first=false,true",
            "trainer.max_steps=20",
            "trainer.max_epochs=-1",
            "trainer.val_check_interval=20",
            "trainer.check_val_every_n_epoch=null",
            "logger=many",
        ],
        tmp_path,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep_dir,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    jobs = sorted(p for p in sweep_dir.iterdir() if (p / "metrics.json").is_file())
    assert len(jobs) == 6
    wandb_runs = {r.name for j in jobs for r in (j / "wandb").glob("offline-run-*")}
    assert len(wandb_runs) == 6
    for job in jobs:  # one W&B group named after the multirun; swept keys at the top level
        (run,) = (job / "wandb").glob("offline-run-*")
        (log,) = run.glob("*.wandb")
        records = read_wandb_records(log)
        groups = {r.run.run_group for r in records if r.WhichOneof("record_type") == "run"}
        assert groups == {sweep_dir.name}
        config = {
            i.key
            for r in records
            if r.WhichOneof("record_type") == "config"
            for i in r.config.update
        }
        assert {"model.num_heads", "model.norm_first", "config"} <= config

    result = cli([str(sweep_dir)], tmp_path, module="aiayn.sweeps")
    assert result.returncode == 0, result.stderr[-3000:]
    table = (sweep_dir / "sweep.md").read_text().splitlines()
    assert len(table) == 2 + 6
    rows = [line.split(" | ")[1].lower() for line in table[2:]]  # only what varies is shown
    assert rows == [
        f"model.num_heads={h} model.norm_first={n}" for h in (1, 4, 8) for n in ("false", "true")
    ]
    csv_rows = (sweep_dir / "sweep.csv").read_text().splitlines()
    assert len(csv_rows) == 7
    for row in csv_rows[1:]:  # parameters, val/bleu, val/ppl, best val/bleu, tokens/s filled
        assert all(row.split(",")[i] for i in range(2, 7)), row
    assert (sweep_dir / "sweep.png").stat().st_size > 1000


def test_sweep_table3_launches_every_row_and_the_report_covers_them(tmp_path):
    """`train.py -m sweep=table3` (every named grid's rows are among its 24 jobs) at two
    updates a job on the tiny model: every ablation composes, builds and trains, and the
    `--paper table3` report has a row for each, the paper's numbers beside those it has."""
    import yaml

    from aiayn.cli.table3 import PAPER

    grid = yaml.safe_load((REPO / "conf" / "sweep" / "table3.yaml").read_text())
    rows = grid["hydra"]["sweeper"]["params"]["ablation"].split(",")
    result = cli(
        [
            "-m",
            "sweep=table3",
            *cli_overrides(tmp_path),
            "data.toy.train_size=300",
            "data.toy.val_size=8",
            "data.toy.test_size=8",
            "trainer.max_steps=2",
            "trainer.max_epochs=-1",
            "trainer.val_check_interval=2",
            "trainer.check_val_every_n_epoch=null",
            "decode.max_len_b=3",
            "test=false",
        ],
        tmp_path,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep_dir,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    jobs = sorted(
        (p for p in sweep_dir.iterdir() if (p / "metrics.json").is_file()),
        key=lambda p: int(p.name),
    )
    assert len(jobs) == len(rows) == 24
    report = cli([str(sweep_dir), "--paper", "table3"], tmp_path, module="aiayn.sweeps")
    assert report.returncode == 0, report.stderr[-3000:]
    table = [
        line for line in (sweep_dir / "table3.md").read_text().splitlines() if line.startswith("| ")
    ]
    reported = {line.split(" | ")[0].removeprefix("| ") for line in table[1:]}
    assert reported == set(rows)
    for line in table[1:]:
        row, paper_ppl = line.split(" | ")[0].removeprefix("| "), line.split(" | ")[7]
        assert bool(paper_ppl.strip()) == (row in PAPER), line


def _two_processes(launcher: str, args: list[str], job: int = 1) -> list[str]:
    """Two processes of `launch` that must each exit 0 as their rank; their outputs."""
    outputs = []
    for rank, (code, output, _) in enumerate(launch(launcher, args, job)):
        assert code == 0, output[-3000:]
        assert f"GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/2" in output, output[-3000:]
        outputs.append(output)
    return outputs


def test_torchrun_two_nodes_on_localhost_match_one_process(tmp_path):
    """`torchrun --nnodes 2 --node-rank {0,1} --master-addr 127.0.0.1` (one gloo process per
    "node") through train.py unchanged, nothing prepared beforehand: both ranks write one run
    directory, one of them prepares the data while the other waits, and the weights equal one
    process accumulating the same global batch."""
    one = tmp_path / "one"
    result = cli([*cli_overrides(one), *DDP_COMMON, *ONE_PROCESS], one)
    assert result.returncode == 0, result.stderr[-3000:]
    two = tmp_path / "two"
    args = [*cli_overrides(two), *DDP_COMMON, "trainer.val_check_interval=6"]
    outputs = _two_processes("torchrun", [*args, "trainer.num_nodes=2", "trainer.devices=1"])
    (run_dir,) = run_dirs(two)
    assert sum("prepared data cache" in output for output in outputs) == 1
    assert len(list(run_dir.glob("**/config.yaml"))) == 1  # rank 0's record only
    # each rank its own log file: rank 0 train.log, rank 1 train_rank1.log
    logs = {path.name: path.read_text() for path in run_dir.glob("*.log")}
    assert sorted(logs) == ["train.log", "train_rank1.log"], sorted(logs)
    assert "GLOBAL_RANK: 0" in logs["train.log"] and "GLOBAL_RANK: 1" not in logs["train.log"]
    assert "GLOBAL_RANK: 1" in logs["train_rank1.log"]
    (run_one,) = run_dirs(one)
    _assert_close_weights(
        run_one / "checkpoints" / "last.ckpt", run_dir / "checkpoints" / "last.ckpt"
    )
    la, lb = csv_metrics(run_one)["val/loss"], csv_metrics(run_dir)["val/loss"]
    assert la == pytest.approx(lb, rel=2e-3)


def test_resume_under_another_launcher_is_exact_and_another_world_size_is_refused(tmp_path):
    """Stopped mid-epoch under torchrun, resumed under srun (the same 2 processes, started
    otherwise): the weights of a run that never stopped (under srun). Resuming that checkpoint
    with one process is refused before any work: the data position is per process."""
    common = [*DDP_COMMON, "trainer.val_check_interval=4", "model.dropout=0.2"]
    torchrun = ["trainer.num_nodes=2", "trainer.devices=1"]
    straight = tmp_path / "straight"  # srun claims the run directory for both its ranks
    _two_processes("srun", [*cli_overrides(straight), *common, "trainer.devices=2"], job=5)
    stopped = tmp_path / "stopped"
    args = [*cli_overrides(stopped), *common]
    _two_processes("torchrun", [*args, *torchrun, "trainer.max_steps=4"])
    (run,) = run_dirs(stopped)
    last = run / "checkpoints" / "last.ckpt"
    state = torch.load(last, weights_only=True)["TranslationDataModule"]["train_sampler"]
    assert 0 < state["position"] < state["batches"]  # mid-epoch: the position matters

    resume = [f"ckpt_path={last}", "trainer.max_steps=12"]
    refused = cli([*args, *resume, "trainer.devices=1"], stopped)
    assert refused.returncode == 1
    assert "2-process run, and this run starts 1" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert torch.load(last, weights_only=True)["global_step"] == 4  # nothing written

    _two_processes("srun", [*args, *resume, "trainer.devices=2"], job=7)
    assert run_dirs(stopped) == [run]  # continued in place
    straight_last = run_dirs(straight)[0] / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 12
    assert _max_diff(_weights(straight_last), _weights(last)) <= 1e-6


def _ids_by_epoch(path) -> dict[int, list[int]]:
    """The example ids `RecordIds` wrote under `path` (every rank's file), by epoch."""
    seen: dict[int, list[int]] = {}
    for file in path.parent.glob(f"{path.name}.*"):
        for line in file.read_text().splitlines():
            epoch, ids = json.loads(line)
            seen.setdefault(epoch, []).extend(ids)
    return seen


@pytest.mark.parametrize("resumed_on", [2, 3])
def test_an_epoch_end_of_four_processes_resumes_on_fewer_and_sees_each_example_once(
    resumed_on, tmp_path
):
    """torchrun, 4 one-process "nodes", stops at the end of epoch 0; resumed on 3 or 2, the
    next epoch covers every example of the first exactly once, and none of epoch 0 is seen
    again (issue 49: on f5393e6, 4 -> 2 processes replayed 0.49 of the stopped epoch, as
    tests/data/test_sampler.py shows on the sampler alone)."""
    small = ["data.toy.train_size=200", "data.toy.val_size=20", "data.toy.test_size=20"]
    small += ["data.max_tokens=512", "trainer.accelerator=cpu", "test=false", "val_bleu=false"]
    small += ["callbacks.model_checkpoint.monitor=val/loss", "callbacks.model_checkpoint.mode=min"]
    small += ["trainer.max_steps=-1", "+callbacks.ids._target_=tests.training.callbacks.RecordIds"]
    args = [*cli_overrides(tmp_path), *small, "trainer.devices=1"]
    first = tmp_path / "ids_first"
    for code, output, _ in launch(
        "torchrun",
        [*args, f"+callbacks.ids.path={first}", "trainer.max_epochs=1", "trainer.num_nodes=4"],
        count=4,
    ):
        assert code == 0, output[-3000:]
    (run,) = run_dirs(tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    state = saved["TranslationDataModule"]["train_sampler"]
    assert state["position"] == state["batches"]  # the epoch's end
    then = tmp_path / "ids_then"
    resume = [f"ckpt_path={last}", "trainer.max_epochs=2", f"trainer.num_nodes={resumed_on}"]
    for code, output, _ in launch(
        "torchrun", [*args, f"+callbacks.ids.path={then}", *resume], count=resumed_on
    ):
        assert code == 0, output[-3000:]
    before, after = _ids_by_epoch(first), _ids_by_epoch(then)
    assert list(before) == [0] and list(after) == [1]  # nothing of epoch 0 again
    assert len(before[0]) == len(set(before[0])) > 150
    assert sorted(after[1]) == sorted(before[0])  # each example once
    assert torch.load(last, weights_only=True)["global_step"] > saved["global_step"]


def test_fsdp_on_two_cpu_processes_matches_ddp_and_its_checkpoints_load_on_one_device(tmp_path):
    """`trainer=fsdp` (FSDP2 over gloo, each process holding half of every weight) trains to
    the weights DDP trains to on the same batches, validates with decoding, writes whole
    checkpoints that evaluate.py loads on one device, and averages its last snapshots as DDP
    does, then tests the average (`test_ckpt=averaged`; issue 49: Lightning's FSDP1 wrote
    shard-shaped averages)."""
    common = [*DDP_COMMON, "trainer.val_check_interval=6", "trainer.devices=2"]
    common += ["callbacks=[default,average]", "callbacks.average.last=2", "test=true"]
    common += ["test_ckpt=averaged"]
    runs = {}
    for strategy in ("ddp", "fsdp"):
        where = tmp_path / strategy
        result = cli([*cli_overrides(where), *common, f"trainer={strategy}"], where)
        assert result.returncode == 0, result.stderr[-3000:]
        if strategy == "fsdp":
            held = re.search(
                r"fsdp: 5 units sharded over 2 processes; this one holds (\S+) of (\S+)",
                result.stdout,
            )
            assert held, result.stdout[-3000:]
            local, total = (int(n.replace(",", "")) for n in held.groups())
            assert local < 0.6 * total  # about half of every weight
        (runs[strategy],) = run_dirs(where)
    ddp, fsdp = (runs[s] / "checkpoints" / "last.ckpt" for s in ("ddp", "fsdp"))
    wa, wb = _weights(ddp), _weights(fsdp)
    assert {k: v.shape for k, v in wa.items()} == {k: v.shape for k, v in wb.items()}
    _assert_close_weights(ddp, fsdp)
    averaged = [runs[s] / "checkpoints" / "averaged.ckpt" for s in ("ddp", "fsdp")]
    assert {k: v.shape for k, v in _weights(averaged[1]).items()} == {
        k: v.shape for k, v in wa.items()
    }
    _assert_close_weights(*averaged)
    froms = [torch.load(a, weights_only=True)["averaged_from"] for a in averaged]
    assert froms[0] == froms[1] == ["step 6", "step 12"]
    assert not list((runs["fsdp"] / "checkpoints").glob(".snapshot-*"))
    tested = json.loads((runs["fsdp"] / "metrics.json").read_text())
    assert tested["test_checkpoint"] == str(averaged[1])
    assert tested["test"]["test/loss"] > 0
    la, lb = csv_metrics(runs["ddp"])["val/loss"], csv_metrics(runs["fsdp"])["val/loss"]
    assert la == pytest.approx(lb, rel=2e-3)
    # its best checkpoint, scored on one device, has the val loss the sharded run logged for it
    best = runs["fsdp"] / "checkpoints" / "best.ckpt"
    out = tmp_path / "eval"
    args = [f"ckpt_path={best}", "device=cpu", "mode=score", "split=val", f"paths.log_dir={out}"]
    result = cli(args, out, module="evaluate.py")
    assert result.returncode == 0, result.stderr[-3000:]
    (scored,) = out.glob("**/score.json")
    assert json.loads(scored.read_text())["nll_per_token"] == pytest.approx(min(lb), rel=1e-3)
