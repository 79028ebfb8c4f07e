"""Building a TrainConfig: defaults < --recipe < a checkpoint's trained model < the YAML file < the flags
given; and back again, as plain values (`config_to_dict`) and as an argv (`to_argv`).

Every value passes through its field's one converter and range check (fields.py `FieldSpec`), whatever
its source, and the whole config through `TrainConfig.validate`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml
from maskrcnn_launcher.contract import load_yaml

from ..errors import ConfigError
from .fields import FieldSpec
from .presets import RECIPES
from .train_config import BY_FLAG, TrainConfig

__all__ = ["apply_overrides", "build_config", "config_to_dict", "load_yaml_config", "to_argv"]


def apply_overrides(cfg: Any, values: dict[str, Any], source: str, table: dict[str, FieldSpec] = BY_FLAG) -> Any:
    """Set fields of `cfg` (a TrainConfig, or the dataclass `table` describes) from a flag-name -> value
    mapping; unknown names are an error that names them."""
    unknown = sorted(set(values) - set(table))
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; known keys are the command's flags")
    for flag, value in values.items():
        spec = table[flag]
        try:
            parsed = spec.parse(value)
        except ValueError as exc:
            raise ConfigError(f"{source}: {flag}: value {value!r} does not fit ({exc})") from exc
        if problem := spec.problem(parsed):
            raise ConfigError(f"{source}: {problem}")
        spec.set(cfg, parsed)
    return cfg


def load_yaml_config(path: Path) -> dict[str, Any]:
    """Read a YAML config file of flag names (dashes or underscores) -> values."""
    try:
        raw = load_yaml(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"--config {path}: the file does not exist") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--config {path}: not a text (UTF-8 YAML) file ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read it: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path}: not valid YAML: {exc}") from exc
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"--config {path}: must hold a mapping of flag names to values")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        flag = str(key).replace("_", "-")
        if flag in values:  # data_path and data-path name one flag: which one wins would be a guess
            raise ConfigError(f"--config {path}: {flag} is given twice (as {key!r} and with the other spelling)")
        values[flag] = value
    return values


def build_config(
    yaml_path: Path | None,
    cli_values: dict[str, Any],
    base: dict[str, Any] | None = None,
    for_engine: bool = True,
) -> TrainConfig:
    """Defaults, then the --recipe's flags (named on the command line, or else in the YAML file), then
    `base` (a checkpoint's trained model, modeling/trained.py: the weights are that model, whatever a
    recipe would build), then the YAML file, then the flags the user actually gave. A rule the recipe's
    flags break names the recipe and the flag that overrides it. `for_engine`: the config runs --engine
    (train, eval), so a flag the user gave that the engine never reads is refused; `profile`, which
    weighs every engine, says False."""
    cfg = TrainConfig()
    from_yaml = load_yaml_config(yaml_path) if yaml_path is not None else {}
    given = {k: v for k, v in cli_values.items() if v is not None}
    recipe = given.get("recipe", from_yaml.get("recipe"))
    from_recipe: set[str] = set()
    if recipe is not None:
        apply_overrides(cfg, {"recipe": recipe}, "command line" if "recipe" in given else str(yaml_path))
        apply_overrides(cfg, RECIPES[cfg.recipe], f"--recipe {cfg.recipe}")
        from_recipe = set(RECIPES[cfg.recipe]) - set(from_yaml) - set(given) - set(base or {})
    if base:
        apply_overrides(cfg, {k: v for k, v in base.items() if v is not None}, "checkpoint")
    apply_overrides(cfg, from_yaml, str(yaml_path))
    apply_overrides(cfg, given, "command line")
    cfg.validate(from_recipe)
    typed = {**from_yaml, **given}
    problems = [_unread_by_scheduler(cfg, typed), *(_unread_by_engine(cfg, typed) if for_engine else [])]
    if problems := [problem for problem in problems if problem]:
        raise ConfigError("; ".join(problems))
    return cfg


def _unread_by_engine(cfg: TrainConfig, typed: dict[str, Any]) -> list[str]:
    """A flag the user gave (command line or YAML) that only other engines read (its field's `engines`):
    refused as --elastic and --compile are where they cannot apply. A boolean counts when it turns
    something on: `--no-bf16-transport` asks for nothing the engine lacks."""
    problems = []
    for flag, value in typed.items():
        spec = BY_FLAG[flag]
        if spec.engines is None or cfg.engine in spec.engines or (spec.kind is bool and not spec.parse(value)):
            continue
        what = spec.help.split(": ", 1)[-1]
        problems.append(
            f"--{flag} is for --engine {' and '.join(spec.engines)} ({what}), and --engine {cfg.engine} never "
            f"reads it; leave out --{flag}"
        )
    return problems


def _unread_by_scheduler(cfg: TrainConfig, typed: dict[str, Any]) -> str | None:
    """A schedule flag the user gave (command line or YAML) that the chosen --lr-scheduler never reads: a
    silent no-op would train on another schedule than the one asked for. (A recipe's are not the user's.)"""
    if cfg.optim.lr_scheduler != "cosineannealinglr":
        return None
    unread = [flag for flag in ("lr-steps", "lr-gamma") if flag in typed]
    if not unread:
        return None
    return (
        f"--{' and --'.join(unread)} {'are' if len(unread) > 1 else 'is'} for --lr-scheduler multisteplr: "
        "cosineannealinglr decays the rate to 0 over the run's epochs and never reads "
        f"{'them' if len(unread) > 1 else 'it'}; leave out --{' and --'.join(unread)}, or use multisteplr"
    )


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Plain types only (str for paths, lists for tuples): safe for JSON and weights_only checkpoints."""

    def plain(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, tuple):
            return list(value)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return plain(dataclasses.asdict(cfg))


def to_argv(values: dict[str, Any]) -> list[str]:
    """Flag-name -> value as command-line words (`--flag value`, `--flag`/`--no-flag` for booleans)."""
    argv: list[str] = []
    for flag, value in values.items():
        spec = BY_FLAG[flag]
        if spec.kind is bool:
            argv.append(f"--{'' if spec.parse(value) else 'no-'}{flag}")
        elif spec.kind is tuple and isinstance(value, (list, tuple)):
            argv += [f"--{flag}", ",".join(str(v) for v in value)]
        else:
            argv += [f"--{flag}", str(value)]
    return argv
