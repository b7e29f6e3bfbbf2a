"""``load_config``: compose a recipe with overrides against the schema, check it, return a typed
``Config``. Hydra/OmegaConf's errors become one-line ``ConfigError``s naming the field and the
fix."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relayrl.config.base import ConfigError
from relayrl.config.root import Config, register_configs
from relayrl.config.validation import fill_defaults, validate

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"
"""The recipes shipped in the repository (``relayrl train --config-name <stem>``)."""


def load_config(config_name: str, overrides: Sequence[str] = (), config_dir: str | None = None) -> Config:
    """Compose a recipe with overrides against the schema, validate it, return a typed ``Config``.

    Hydra/OmegaConf errors (unknown key, wrong type, missing recipe) become one-line ``ConfigError``s.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    search_dir = str(Path(config_dir).resolve()) if config_dir else str(RECIPES_DIR)
    try:
        with initialize_config_dir(config_dir=search_dir, version_base=None):
            composed = compose(config_name=config_name, overrides=list(overrides))
        cfg = OmegaConf.to_object(composed)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(_one_line(exc, config_name, search_dir)) from None
    if not isinstance(cfg, Config):
        raise ConfigError(
            f"recipe {config_name!r} does not extend the schema; add `defaults: [relayrl_schema, _self_]` at its top"
        )
    return validate(fill_defaults(cfg))


def _one_line(exc: Exception, config_name: str, search_dir: str) -> str:
    """Turn a Hydra/OmegaConf error into one line that names the field and the fix."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    msg, cause = str(exc), exc.__cause__
    if "Cannot find primary config" in msg:
        names = sorted(p.stem for p in Path(search_dir).glob("*.yaml"))
        return f"no recipe named {config_name!r} in {search_dir}; choose one of: {', '.join(names)}"
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key:
        return _unknown_key(cause.full_key)
    if isinstance(cause, ValidationError) and cause.full_key:
        return f"{cause.full_key}: {str(cause).splitlines()[0]}; give a value of the field's type"
    if "Available options in" in msg:
        group, choice = msg.split("Could not find '")[1].split("'")[0].split("/", 1)
        options = msg.split(f"Available options in '{group}':")[1].split("Config search path")[0].split()
        return f"{group}={choice} is not an option; use one of: {', '.join(options)}"
    if "No match in the defaults list" in msg:
        group = msg.split("'")[1]
        return f"{group!r} is not a config group; set its fields instead, e.g. {group}.<field>=<value>"
    return " ".join(line.strip() for line in msg.splitlines() if line.strip())


def _unknown_key(full_key: str) -> str:
    """'trainer.lrr' -> one line naming the key, its section's fields and the closest match."""
    import dataclasses
    import difflib
    import typing

    *parents, leaf = full_key.split(".")
    node: Any = Config
    for part in parents:
        node = typing.get_type_hints(node).get(part)
        if not dataclasses.is_dataclass(node):
            return f"unknown config key {full_key!r}; remove it or check the schema in relayrl/config/"
    fields = [f.name for f in dataclasses.fields(node) if f.name != "defaults"]
    close = difflib.get_close_matches(leaf, fields, n=1)
    hint = f"did you mean {'.'.join([*parents, close[0]])!r}?" if close else f"valid keys: {', '.join(fields)}"
    return f"unknown config key {full_key!r}; {hint}"
