"""What every command's schema shares: `to_schema` builds a command's dataclass from a composed
config and names the dotted key of any error, `plain` turns one back into plain containers,
and `PathsConfig` and `DecodeOverrides` are fields of several commands' schemas."""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass
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

    def given(self) -> dict[str, Any]:
        """The keys that were set."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class PathsConfig:
    root_dir: str = "."
    log_dir: str = "logs"
    output_dir: str = "."


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
