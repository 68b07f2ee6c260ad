"""What every command's schema shares: `to_schema` builds a command's dataclass from a composed
config and names the dotted key of any error, `plain` turns one back into plain containers,
and `PathsConfig` and `DecodeOverrides` are fields of several commands' schemas."""

from __future__ import annotations

import difflib
import re
import types
import typing
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any, Optional, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from aiayn.errors import ConfigError

T = TypeVar("T")

# nested schemas name fields by class; users type them under these keys
SCHEMA_KEYS = {
    "TokenizerConfig": "data.tokenizer",
    "DataConfig": "data",
    "ModelConfig": "model",
    "DecodeConfig": "decode",
}


@dataclass
class DecodeOverrides:
    """Decode keys on top of other settings (a checkpoint's, or `decode` for `val_decode`):
    each is None (kept) unless given, so that `decode.nbest=2` and `+decode.nbest=2` both
    override (`DecodeConfig` says what each means and validates the result)."""

    strategy: Optional[str] = None  # noqa: UP045 (OmegaConf needs Optional)
    beam_size: Optional[int] = None  # noqa: UP045
    length_penalty: Optional[float] = None  # noqa: UP045
    max_len_a: Optional[float] = None  # noqa: UP045
    max_len_b: Optional[int] = None  # noqa: UP045
    nbest: Optional[int] = None  # noqa: UP045
    top_k: Optional[int] = None  # noqa: UP045
    top_p: Optional[float] = None  # noqa: UP045
    temperature: Optional[float] = None  # noqa: UP045
    seed: Optional[int] = None  # noqa: UP045
    prefix: Optional[str] = None  # noqa: UP045

    def check(self, key: str = "decode") -> None:
        """Each given key in its range now, before any work (ConfigError naming it as
        `key.<name>`): checked on a `DecodeConfig` the given keys complete without
        contradicting (the keys kept from elsewhere are checked with them when applied)."""
        from aiayn.model.generate import DecodeConfig

        given = self.given()
        nbest = given.get("nbest", 1)
        probe = {"strategy": "beam" if nbest != 1 else "greedy", "nbest": nbest}
        probe["beam_size"] = max(nbest, 1) if isinstance(nbest, int) else 1
        try:
            DecodeConfig(**{**probe, **given})
        except ValueError as error:
            raise ConfigError(str(error).replace("DecodeConfig.", f"{key}.")) from None

    def given(self) -> dict[str, Any]:
        """The keys that were set."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class PathsConfig:
    root_dir: str = "."
    log_dir: str = "logs"
    output_dir: str = "."


def command_line_settings() -> dict[str, str] | None:
    """This Hydra job's command-line overrides, dotted key (`+`/`++`/`~` stripped) -> the
    value as typed (`model.num_heads=4` -> {"model.num_heads": "4"}; a deletion without a
    value is left out), or None outside a Hydra job (a library call, a saved config)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    overrides = HydraConfig.get().overrides.task
    return dict(o.lstrip("+~").split("=", 1) for o in overrides if "=" in o)


def to_schema(cfg: DictConfig | dict, schema: type[T]) -> T:
    """Merge `cfg` onto the dataclass `schema` and build it; errors name the dotted key.

    `cfg` is merged as plain containers (interpolations kept), so that a key the schema lacks
    is rejected also when it was forced in with `+key=value`."""
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=False)  # type: ignore[assignment]
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), cfg)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        reason = str(err).splitlines()[0]
        hint = did_you_mean(key, OmegaConf.structured(schema)) if " not in " in reason else ""
        raise ConfigError(f"config key {key!r}: {reason}{hint}") from None
    except ValueError as err:
        if isinstance(err, ConfigError):
            raise
        message = str(err)
        for cls, key in SCHEMA_KEYS.items():  # name the key as the user types it
            message = message.replace(f"{cls}.", f"{key}.")
        raise ConfigError(message) from None


def did_you_mean(key: str, keys: Any) -> str:
    """'; did you mean <key>?' for the dotted `key` when a key of its parent node in `keys` (a
    config, or the names themselves) is close to its last part, else ''."""
    parent, _, name = key.rpartition(".")
    if not isinstance(keys, (list, tuple, set)):
        node = OmegaConf.select(keys, parent) if parent else keys
        keys = list(node.keys()) if isinstance(node, DictConfig) else []
    close = difflib.get_close_matches(name, [str(k) for k in keys], n=1, cutoff=0.75)
    return f"; did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""


def plain(obj: Any) -> Any:
    """A dataclass config as plain dicts/lists (for hyper-parameters and loggers)."""
    return OmegaConf.to_container(OmegaConf.structured(obj), resolve=True)


def check_override_keys(overrides: list[str], schema: type, groups: set[str]) -> None:
    """Refuse a command-line `key=value` whose key the command's schema does not have, with
    the closest key, before Hydra composes anything (Hydra's own message suggests none).
    Group choices (`model=base`), `+`/`~` overrides, flags, Hydra's keys and what lies under
    a free-form node (`trainer.*`, `callbacks.*`) are left to Hydra and the schemas."""
    for override in overrides:
        key, equals, value = override.partition("=")
        if not equals or override.startswith(("-", "+", "~")) or key in groups:
            continue
        if key.split(".")[0] == "hydra" or "/" in key or "@" in key:
            continue
        node: Any = schema
        for depth, part in enumerate(key.split(".")):
            fields = _fields_of(node)
            if fields is None:  # a dict, Any or a list: anything goes under it
                break
            if part not in fields:
                path = ".".join(key.split(".")[: depth + 1])
                hint = did_you_mean(path, list(fields))
                raise ConfigError(f"{key}: no such key{hint or ''} (`--cfg job` shows the keys)")
            node = fields[part]
        else:  # every part is a field: `node` is the key's type
            _check_literal(key, value, node)


NUMBERS = {int: "an integer", float: "a number"}
# what OmegaConf reads as a bool, besides any integer (0 is false), in any case
BOOLEANS = ("true", "false", "yes", "no", "on", "off", "y", "n")
# a value Hydra reads as something else than one literal: a sweep, a function, an
# interpolation, a list or mapping, quoted text, null
NOT_A_LITERAL = re.compile(r"[,()$\[\]{}'\"]|^null$")


def _check_literal(key: str, value: str, annotation: Any) -> None:
    """Refuse a literal that is not the int, float or bool `annotation` (through Optional)
    asks for, in one line (Hydra's own message spans five)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if annotation not in (*NUMBERS, bool) or NOT_A_LITERAL.search(value):
        return
    if annotation is bool:
        if value.strip().lower() not in BOOLEANS and not _reads_as(int, value):
            raise ConfigError(f"{key}={value}: {key} takes true or false")
    elif not _reads_as(annotation, value):
        raise ConfigError(f"{key}={value}: {key} takes {NUMBERS[annotation]}")


def _reads_as(kind: type, value: str) -> bool:
    """Whether `kind(value)` (int or float) reads the literal."""
    try:
        kind(value)
    except ValueError:
        return False
    return True


def _fields_of(node: Any) -> dict[str, Any] | None:
    """A dataclass's field types by name (through Optional), else None."""
    args = [a for a in typing.get_args(node) if a is not type(None)]
    if typing.get_origin(node) in (typing.Union, types.UnionType) and len(args) == 1:
        node = args[0]
    if not (isinstance(node, type) and is_dataclass(node)):
        return None
    return typing.get_type_hints(node)
