"""Every shipped YAML composes into a valid TrainConfig; bad keys and values are named."""

from pathlib import Path

import pytest

from aiayn.config import CONF_DIR, TrainConfig, to_schema
from aiayn.errors import ConfigError
from tests.helpers import CONFIG_ERRORS, compose_train, compose_with_hydra

GROUPS = ["data", "model", "optim", "decode", "trainer", "logger", "callbacks", "experiment"]
GROUPS += ["ablation", "hparams_search"]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


SHIPPED = [(g, o) for g in GROUPS for o in _options(g)]


@pytest.mark.parametrize(("group", "option"), SHIPPED, ids=[f"{g}={o}" for g, o in SHIPPED])
def test_every_shipped_config_composes_and_validates(group, option, tmp_path):
    overrides = [f"{group}={option}"]
    if group == "data" and option == "multi30k":
        overrides.append("data.root=/nonexistent/multi30k")
    cfg = compose_train(overrides, output_dir=tmp_path)
    config = to_schema(cfg, TrainConfig)
    assert isinstance(config, TrainConfig)


@pytest.mark.parametrize(  # the table3 grids compose every row of the paper's table: slow
    "sweep",
    [
        pytest.param(s, marks=pytest.mark.slow) if s in ("table3", "table3_converged") else s
        for s in _options("sweep")
    ],
)
def test_every_named_sweep_defines_a_grid_of_valid_settings(sweep, tmp_path):
    """Each value of each swept key composes into a valid TrainConfig (so a misspelt key such
    as `model.num_head` or an impossible value fails here, not after a sweep launched)."""
    cfg = compose_with_hydra("train", [f"sweep={sweep}"])
    params = cfg.hydra.sweeper.params
    assert params, f"conf/sweep/{sweep}.yaml defines no hydra.sweeper.params"
    recipe = ["experiment=multi30k_cpu"]  # the recipe conf/ablation/'s values are set for
    base = to_schema(compose_train(recipe, tmp_path), TrainConfig)
    for key, values in params.items():
        choices = str(values).split(",")
        assert len(choices) >= 2, f"{key}: {values}"
        for value in choices:
            overrides = [*recipe, f"{key}={value}"]
            config = to_schema(compose_train(overrides, tmp_path), TrainConfig)
            if key == "ablation":  # a conf/ablation/ file: it must change the config
                assert (config == base) == (value == "base"), f"ablation={value}"
                continue
            group, _, name = key.partition(".")
            assert str(getattr(getattr(config, group), name)).lower() == value.lower(), key


def test_defaults_are_the_documented_ones(tmp_path):
    config = to_schema(compose_train([], output_dir=tmp_path), TrainConfig)
    assert config.data.source == "toy"
    assert (config.model.d_model, config.model.num_heads) == (128, 4)
    assert (config.optim.lr, config.optim.warmup_steps, config.data.max_tokens) == (0.5, 400, 1024)
    assert config.trainer["max_epochs"] == 6
    assert config.optim.schedule == "noam"
    assert config.decode.strategy == "greedy"
    assert config.trainer["_target_"] == "lightning.Trainer"
    assert set(config.logger) == {"csv"}


def test_paper_presets_match_the_paper(tmp_path):
    base = to_schema(compose_train(["model=base"], output_dir=tmp_path), TrainConfig).model
    assert (base.d_model, base.d_ff, base.num_heads, base.dropout) == (512, 2048, 8, 0.1)
    assert (base.num_encoder_layers, base.num_decoder_layers, base.norm_first) == (6, 6, False)
    big = to_schema(compose_train(["model=big"], output_dir=tmp_path), TrainConfig).model
    assert (big.d_model, big.d_ff, big.num_heads, big.dropout) == (1024, 4096, 16, 0.3)


# The paper's numbers (Sections 3, 5 and 6.1): model, updates, checkpoint averaging (the last
# 5 / 20 checkpoints written every 10 minutes at 0.4 / 1.0 s per update on 8 P100s).
PAPER_RECIPES = {
    "paper_base": {"shape": (6, 512, 2048, 8, 0.1), "steps": 100_000, "average": (5, 1500)},
    "paper_big": {"shape": (6, 1024, 4096, 16, 0.3), "steps": 300_000, "average": (20, 600)},
}


@pytest.mark.parametrize("experiment", sorted(PAPER_RECIPES))
@pytest.mark.parametrize(
    ("devices", "max_tokens"), [(1, None), (2, None), (4, None), (8, 3125), ("[0,1,2,3]", None)]
)
def test_paper_recipes_carry_the_whole_paper_recipe(experiment, devices, max_tokens, tmp_path):
    paper = PAPER_RECIPES[experiment]
    overrides = [f"experiment={experiment}", f"trainer.devices={devices}"]
    overrides += [f"data.max_tokens={max_tokens}"] if max_tokens else []
    config = to_schema(compose_train(overrides, output_dir=tmp_path), TrainConfig)
    model, optim, data, trainer = config.model, config.optim, config.data, config.trainer
    layers = (model.num_encoder_layers, model.num_decoder_layers)
    shape = (model.d_model, model.d_ff, model.num_heads, model.dropout)
    assert (layers[0], *shape) == paper["shape"] and layers[0] == layers[1]
    assert (model.norm_first, model.positional, model.head_dim) == (False, "sinusoidal", None)
    assert model.share_embeddings == "all" and data.tokenizer.joint
    assert data.tokenizer.vocab_size == 37000
    assert (optim.schedule, optim.lr, optim.warmup_steps) == ("noam", 1.0, 4000)
    assert (list(optim.betas), optim.eps, optim.label_smoothing) == ([0.9, 0.98], 1e-9, 0.1)
    count = devices if isinstance(devices, int) else len(devices.strip("[]").split(","))
    per_update = data.max_tokens * count * trainer["accumulate_grad_batches"]
    assert per_update == 25_000, f"{per_update} tokens per side per update on {count} devices"
    assert (trainer["max_steps"], trainer["max_epochs"]) == (paper["steps"], -1)
    average = config.callbacks["average"]
    assert (average["last"], average["every_n_steps"]) == paper["average"]
    assert config.test_ckpt == "averaged"
    decode = config.decode
    assert (decode.strategy, decode.beam_size, decode.length_penalty) == ("beam", 4, 0.6)
    assert (decode.max_len_a, decode.max_len_b) == (1.0, 50)


@pytest.mark.parametrize(
    ("devices", "nodes", "expected"), [(1, 1, 25000), (4, 1, 6250), (8, 1, 3125), (4, 2, 3125)]
)
def test_each_process_takes_its_share_of_the_update_in_one_micro_batch(devices, nodes, expected):
    """paper_base/paper_big's micro-batch per GPU: the update's 25 000 tokens split over the
    processes, so that no GPU accumulates (the fastest step where memory allows)."""
    from aiayn.config import accumulate_for, share_for

    assert share_for(25000, devices, nodes) == share_for(25000, [0] * devices, nodes) == expected
    assert accumulate_for(25000, expected, devices, nodes) == 1


@pytest.mark.parametrize(
    ("tokens", "max_tokens", "devices", "nodes", "expected"),
    [(25000, 6250, 1, 1, 4), (25000, 6250, 2, 1, 2), (25000, 6250, 2, 2, 1), (9000, 4096, 1, 1, 2)],
)
def test_accumulation_keeps_the_tokens_per_update(tokens, max_tokens, devices, nodes, expected):
    from aiayn.config import accumulate_for

    assert accumulate_for(tokens, max_tokens, devices, nodes) == expected
    assert accumulate_for(tokens, max_tokens, [0] * devices, nodes) == expected


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+model.num_layers=3"], "num_layers"),
        (["model.num_heads=5"], "num_heads"),
        (["model.dropout=1.5"], "dropout"),
        (["model.activation=swish"], "activation"),
        (["model.d_model=abc"], "model.d_model"),
        (["optim.schedule=cosine"], "optim.schedule"),
        (["optim.cooldown=0.2", "trainer.max_epochs=-1"], "set trainer.max_steps"),
        (["+trainer.max_stepz=3"], "max_stepz"),
        (["data.tokenizer.joint=false"], "share_embeddings"),
        (["data.max_len=600"], "max_positions"),
        (["ckpt_path=/no/such.ckpt"], "ckpt_path"),
        (["test_ckpt=newest"], "test_ckpt"),
        (["test_ckpt=averaged"], "callbacks=\\[default,average\\]"),
        (["test_ckpt=ema"], "callbacks=\\[default,ema\\]"),
        (["+val_decode.beam_width=3"], "beam_width"),
        (["+val_decode.strategy=nucleus"], "decode.strategy"),
        (["peer_silence_s=0"], "peer_silence_s must be > 0"),
        # Lightning divides by these: a ZeroDivisionError mid-run before
        (["trainer.accumulate_grad_batches=0"], r"trainer\.accumulate_grad_batches=0 must be > 0"),
        (["trainer.val_check_interval=0"], r"trainer\.val_check_interval=0 must be > 0"),
        (["trainer.val_check_interval=-0.5"], r"trainer\.val_check_interval=-0\.5 must be > 0"),
        (["trainer.check_val_every_n_epoch=0"], r"trainer\.check_val_every_n_epoch=0 must be"),
        (["trainer.max_epochs=0"], r"trainer\.max_epochs=0 trains nothing"),
        (["trainer.max_steps=0"], r"trainer\.max_steps=0 trains nothing"),
        (["trainer.limit_train_batches=0"], r"trainer\.limit_train_batches=0 trains nothing"),
    ],
)
def test_bad_keys_and_values_are_rejected_by_name(overrides, message, tmp_path):
    with pytest.raises(CONFIG_ERRORS, match=message):
        to_schema(compose_train(overrides, output_dir=tmp_path), TrainConfig)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.num_heads=3", "model.num_heads"),
        ("decode.beam_size=0", "decode.beam_size"),
        ("data.tokenizer.vocab_size=2", "data.tokenizer.vocab_size"),
        ("trainer.precision=bogus", "trainer"),
        ("callbacks.model_checkpoint.mode=sideways", "callbacks.model_checkpoint"),
    ],
)
def test_config_errors_come_before_any_work(override, message, tmp_path):
    """Bad values stop `run` before the data is prepared (no cache directory appears), and the
    message names the key as the user types it."""
    from aiayn.training.run import run

    cache = tmp_path / "cache"
    cfg = compose_train([override, f"data.cache_dir={cache}"], output_dir=tmp_path)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        run(cfg)
    assert not Path(cache).exists()


@pytest.mark.parametrize("group", ["callbacks", "logger"])
def test_every_shipped_callback_and_logger_instantiates(group, tmp_path):
    from hydra.utils import instantiate

    for option in _options(group):
        cfg = compose_train([f"{group}={option}"], output_dir=tmp_path)
        for key, node in (cfg[group] or {}).items():
            if group == "logger" and key == "wandb":
                node.offline = True
            assert instantiate(node) is not None, f"{group}/{option}.yaml: {key}"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["val_bleu=false"], "callbacks.model_checkpoint.monitor"),
        (
            [
                "val_bleu=false",
                "callbacks.model_checkpoint.monitor=val/loss",
                "callbacks=[default,early_stopping]",
            ],
            "callbacks.early_stopping.monitor",
        ),
        (["+trainer.callbacks=[]"], "trainer.callbacks"),
        # keys of an option that is not selected (here: the averaging callback's)
        (["+callbacks.average.last=5"], "callbacks.average sets"),
        (["trainer.accelerator=cpu", "trainer.precision=16-mixed"], "trainer.precision=16-mixed"),
        (["trainer.accelerator=cpu", "trainer.devices=4096"], "trainer.devices=4096"),
        (["trainer=fsdp", "callbacks=[default,ema]"], "callbacks.ema"),
        (["trainer=fsdp", "callbacks=[default,attention]"], "callbacks.attention"),
    ],
)
def test_run_level_checks_name_the_key(overrides, message, tmp_path):
    from aiayn.training.run import validate

    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        validate(compose_train(overrides, output_dir=tmp_path))


@pytest.mark.parametrize("group", ["data", "model", "decode", "optim"])
def test_group_files_list_only_what_differs_from_the_schema(group):
    """conf/<group>/*.yaml start from their schema: every key they set changes its default,
    except the key that names the option (data.source, decode.strategy, optim.schedule), which
    each file of those groups states (it also overrides a checkpoint's decode settings)."""
    import dataclasses

    import yaml

    from aiayn.data.config import DataConfig, TokenizerConfig
    from aiayn.model import DecodeConfig, ModelConfig
    from aiayn.training.schedules import OptimConfig

    schema = {"data": DataConfig, "model": ModelConfig, "decode": DecodeConfig}
    schema["optim"] = OptimConfig
    nested = {"tokenizer": TokenizerConfig}

    def defaults(cls):
        return {f.name: f.default for f in dataclasses.fields(cls)}

    for option in _options(group):
        listed = yaml.safe_load((CONF_DIR / group / f"{option}.yaml").read_text()) or {}
        base = defaults(schema[group])
        for key, value in listed.items():
            if key in nested:
                inner = defaults(nested[key])
                for k, v in value.items():
                    assert inner[k] != v, f"{group}/{option}.yaml: {key}.{k}={v} is the default"
            else:
                assert key in base, f"{group}/{option}.yaml: unknown key {key}"
                if key not in ("source", "strategy", "schedule"):
                    assert base[key] != value, f"{group}/{option}.yaml: {key}={value} is default"


def test_bf16_on_a_cpu_without_native_bf16_is_warned_before_any_work(tmp_path, caplog):
    import logging

    import torch

    from aiayn.training.run import validate

    overrides = ["trainer.precision=bf16-mixed", "trainer.accelerator=cpu"]
    with caplog.at_level(logging.WARNING, logger="aiayn.training.run"):
        validate(compose_train(overrides, output_dir=tmp_path))
    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    warned = "without native bfloat16" in caplog.text and "32-true" in caplog.text
    assert warned != native, caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aiayn.training.run"):
        validate(compose_train(["trainer.accelerator=cpu"], output_dir=tmp_path))
    assert "bfloat16" not in caplog.text


def test_a_gpu_recipe_on_a_cpu_is_refused_or_warned_in_one_line(tmp_path, caplog, monkeypatch):
    """experiment=multi30k_gpu (trainer=gpu) where torch sees no GPU: refused before any
    work, naming the CPU recipe; run on the CPU by choice (trainer=cpu): one warning line naming
    it. A GPU recipe without a CPU counterpart (paper_base) is refused naming trainer=cpu."""
    import logging

    import torch

    from aiayn.training.run import run, validate

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine without
    cache = tmp_path / "cache"
    data = ["data.root=/nonexistent", f"data.cache_dir={cache}"]
    refused = r"trainer\.accelerator=gpu, but torch .* sees no GPU on this machine: use "
    with pytest.raises(ConfigError, match=refused + r"experiment=multi30k_cpu, the recipe sized"):
        run(compose_train(["experiment=multi30k_gpu", *data], tmp_path))
    assert not cache.exists()
    with pytest.raises(ConfigError, match=refused + r"trainer=cpu to run it on this CPU$"):
        validate(compose_train(["experiment=paper_base", *data], tmp_path))
    for experiment, warned in (
        ("multi30k_gpu", True),
        ("multi30k_tiny", True),
        ("multi30k_cpu", False),
    ):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            validate(compose_train([f"experiment={experiment}", "trainer=cpu", *data], tmp_path))
        lines = [r.getMessage() for r in caplog.records if "sized for a GPU" in r.getMessage()]
        assert len(lines) == int(warned), (experiment, caplog.text)
        assert all("\n" not in line and "experiment=multi30k_cpu" in line for line in lines)
    with pytest.raises(ConfigError, match=r"cpu_recipe=multi30k_cpx: there is no conf/experiment"):
        validate(compose_train(["trainer=cpu", "cpu_recipe=multi30k_cpx", *data], tmp_path))


def test_only_training_continues_in_the_run_directory_of_its_checkpoint(tmp_path):
    from aiayn.config import resume_run_dir

    run = tmp_path / "runs" / "earlier"
    (run / ".hydra").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    ckpt = run / "checkpoints" / "last.ckpt"
    ckpt.write_bytes(b"")
    fresh = str(tmp_path / "runs" / "new")
    assert resume_run_dir(str(ckpt), fresh) == str(run)  # resume: the same run
    assert resume_run_dir(str(ckpt), fresh, train=False) == fresh  # test-only: its own
    assert resume_run_dir(None, fresh) == fresh


def test_a_checkpoint_outside_any_run_starts_a_run_with_a_plain_record(tmp_path, monkeypatch):
    """A checkpoint copied out of its run (no `<run>/checkpoints/` beside `.hydra/`) resumes
    into a new run directory whose record is the usual `.hydra`; one inside a run records
    the resume beside the original's, never over it."""
    from aiayn.config import resume_output_subdir

    monkeypatch.chdir(tmp_path)  # nothing may be claimed here
    loose = tmp_path / "x.ckpt"
    loose.write_bytes(b"")
    assert resume_output_subdir(str(loose)) == ".hydra"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.ckpt"]
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    subdir = resume_output_subdir(str(run / "checkpoints" / "last.ckpt"))
    assert subdir is not None and subdir.startswith(".hydra/resume-")


@pytest.mark.parametrize("setting", ["elsewhere", "", None])
def test_runs_go_where_AIAYN_LOG_DIR_says_else_to_logs(setting, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a run is launched: root_dir "."
    if setting is None:
        monkeypatch.delenv("AIAYN_LOG_DIR")
    else:
        monkeypatch.setenv("AIAYN_LOG_DIR", str(tmp_path / setting) if setting else "")
    cfg = compose_with_hydra("train")
    expected = tmp_path / setting if setting else Path("./logs")
    assert Path(cfg.paths.log_dir) == expected  # empty or unset: <root_dir>/logs
    run = Path(cfg.hydra.run.dir)
    assert run.parent == expected / "train" / "runs" and (tmp_path / run).is_dir()


@pytest.mark.parametrize("name", ["train", "eval", "translate", "export", "visualize", "prepare"])
def test_a_root_yaml_holds_only_what_differs_from_its_schema(name):
    """conf/<command>.yaml lists its defaults list and deltas: a top-level value equal to the
    schema's default would be a second copy that drifts (the schema documents each key)."""
    import dataclasses

    import yaml

    from aiayn.config import CONF_DIR, SCHEMAS

    schema = SCHEMAS[f"{name}_schema"]
    defaults = {}
    for f in dataclasses.fields(schema):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            defaults[f.name] = (
                dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
            )
    root = yaml.safe_load((CONF_DIR / f"{name}.yaml").read_text())
    repeated = {k: v for k, v in root.items() if k in defaults and v == defaults[k]}
    assert not repeated, f"conf/{name}.yaml repeats its schema's defaults: {repeated}"
    assert set(root) - {"defaults", "hydra"} <= set(defaults)  # and names only schema keys


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.strategy=fsdp"], "trainer.strategy=fsdp is not supported .* use trainer=fsdp"),
        (["trainer.strategy=deepspeed_stage_2"], "use trainer.strategy=ddp"),
        (["trainer.strategy=ddp_spawn"], "ddp_spawn is not supported"),
        (
            [
                "trainer=fsdp",
                "trainer.accelerator=cpu",
                "trainer.strategy.save_distributed_checkpoint=true",
            ],
            "save_distributed_checkpoint=true .* set it to false",
        ),
        (
            ["+trainer.strategy._target_=lightning.pytorch.strategies.FSDPStrategy"],
            "FSDPStrategy is not supported",
        ),
    ],
)
def test_a_strategy_not_supported_end_to_end_is_refused_by_key(overrides, message, tmp_path):
    """Lightning's FSDP1, DeepSpeed, spawn launchers and sharded checkpoints would train and
    then fail at resume, averaging, evaluate or export (issue 49): refused before any work,
    naming the key and the spelling that works."""
    from aiayn.training.run import validate

    with pytest.raises(ConfigError, match=message):
        validate(compose_train(overrides, output_dir=tmp_path))


@pytest.mark.parametrize(
    "overrides",
    [[], ["trainer=ddp", "trainer.accelerator=cpu"], ["trainer=fsdp", "trainer.accelerator=cpu"]],
)
def test_the_supported_strategies_pass(overrides, tmp_path):
    from aiayn.training.run import validate

    validate(compose_train(overrides, output_dir=tmp_path))


def test_a_validation_interval_beyond_an_epoch_is_one_line_before_fitting(tmp_path):
    """An integer `trainer.val_check_interval` counts the batches of an epoch unless
    `trainer.check_val_every_n_epoch=null`: one beyond the epoch's batches is refused with
    the number there is, before any update (Lightning raised it as a traceback); with
    `check_val_every_n_epoch=null` the same interval counts across epochs and trains."""
    from aiayn.training.run import run

    base = ["model=tiny", "data.toy.train_size=300", "data.toy.val_size=20", "test=false"]
    base += ["trainer.max_steps=3", "trainer.max_epochs=-1", "data.max_tokens=1024"]
    cfg = compose_train([*base, "trainer.val_check_interval=500"], output_dir=tmp_path / "a")
    with pytest.raises(ConfigError, match=r"^trainer\.val_check_interval=500 is more than the \d+"):
        run(cfg)
    assert not list((tmp_path / "a").rglob("*.ckpt"))
    across = ["trainer.val_check_interval=500", "trainer.check_val_every_n_epoch=null"]
    metrics = run(compose_train([*base, *across], output_dir=tmp_path / "b"))
    assert metrics["updates"] == 3
