"""Dotted overrides: the one path every change of a setting takes (preset, YAML, ``--set``, a Tune
``param_space``, a checkpoint's stored config), type coercion, renamed keys, flat dicts, YAML loading, and
the generated field listing.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from muzero_tune.config.schema import ExperimentConfig
from muzero_tune.errors import ConfigError, ConfigWarning, PathError, UserError

# a setting's former dotted name -> its name now: still read (YAML files, --set, Tune configs, the configs
# stored in checkpoints and run folders) with a ConfigWarning naming the new one
RENAMED_KEYS: dict[str, str] = {
    "max_env_step": "max_envstep",
}


def current_key(key: str, *, warn: bool = True) -> str:
    """``key``'s name now (itself unless :data:`RENAMED_KEYS` holds it; a ConfigWarning if it does)."""
    new = RENAMED_KEYS.get(key)
    if new is None:
        return key
    if warn:
        warnings.warn(f"config key '{key}' is now '{new}'; the old name still works for now", ConfigWarning,
                      stacklevel=3)  # fmt: skip
    return new

# ---------------------------------------------------------------------------------------------- overrides


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A config class's resolved type hints (cached: resolving them is most of an override's cost)."""
    return typing.get_type_hints(cls)


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def iter_fields(
    cls: type = ExperimentConfig, prefix: str = ""
) -> Iterator[tuple[str, Any, dataclasses.Field]]:
    """Yield (dotted key, type, field) for every leaf setting, in declaration order."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if _is_section(tp):
            yield from iter_fields(tp, key + ".")
        else:
            yield key, tp, f


def leaf_keys() -> list[str]:
    return [k for k, _, _ in iter_fields()]


def _type_name(tp: Any) -> str:
    if tp in (int, float, str, bool):
        return tp.__name__
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else _type_name(a) for a in args)
    if origin is tuple:
        return f"tuple[{_type_name(args[0])}, ...]"
    if origin is dict:
        return "mapping"
    return str(tp)


def _is_mapping_type(tp: Any) -> bool:
    """A setting whose value is a whole mapping (e.g. ``env.kwargs``): set as one value, or key by key."""
    return typing.get_origin(tp) is dict


def _yaml_value(key: str, raw: str) -> Any:
    """A command-line value read as YAML (numbers, lists, mappings); text YAML cannot read is refused."""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as err:
        problem = " ".join(str(getattr(err, "problem", None) or err).split())
        raise ConfigError(key, raw, f"not a value YAML can read ({problem})") from None


def _coerce(key: str, tp: Any, value: Any) -> Any:
    """Convert ``value`` (possibly a string from the CLI) to type ``tp`` or raise ConfigError."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "~")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, inner[0], value)
    if isinstance(value, str) and tp is not str:
        raw = value
        value = _yaml_value(key, raw)
        if isinstance(value, str) and tp in (int, float):
            try:  # YAML 1.1 reads "1e-3" as a string
                value = float(raw)
            except ValueError:
                pass
    if origin is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise ConfigError(key, value, "expected a mapping with string keys, e.g. {name: value}")
        return dict(value)
    if origin is tuple:
        (elem,) = typing.get_args(tp)[:1]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, value, f"expected a list of {_type_name(elem)}")
        return tuple(_coerce(key, elem, v) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, value, "expected a bool (true/false)")
    if tp is int:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or int(value) != value:
            raise ConfigError(key, value, "expected an integer")
        return int(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, value, "expected a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, value, "expected a string")
        return value
    raise ConfigError(key, value, f"unsupported type {tp}")


def _unknown_key(key: str) -> ConfigError:
    keys = leaf_keys()
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    hint = (
        f"did you mean {' or '.join(repr(c) for c in close)}?" if close else "run `muzero-tune train --help`"
    )
    return ConfigError(key, "<unknown key>", f"no such setting; {hint}")


def _set(cfg: Any, path: list[str], value: Any, full_key: str) -> Any:
    hints = _hints(type(cfg))
    names = {f.name for f in dataclasses.fields(cfg)}
    head = path[0]
    if head not in names:
        raise _unknown_key(full_key)
    tp = hints[head]
    if len(path) == 1:
        if _is_section(tp):
            if not isinstance(value, Mapping):
                raise ConfigError(full_key, value, f"is a section; set its keys, e.g. {full_key}.<key>=...")
            out = getattr(cfg, head)
            for k, v in value.items():
                out = _set(out, [k], v, f"{full_key}.{k}")
            return dataclasses.replace(cfg, **{head: out})
        return dataclasses.replace(cfg, **{head: _coerce(full_key, tp, value)})
    if _is_mapping_type(tp):  # env.kwargs.<name>=value sets one entry of the mapping
        entry = ".".join(path[1:])
        value = _yaml_value(full_key, value) if isinstance(value, str) else value
        return dataclasses.replace(cfg, **{head: {**getattr(cfg, head), entry: value}})
    if not _is_section(tp):
        raise _unknown_key(full_key)
    return dataclasses.replace(cfg, **{head: _set(getattr(cfg, head), path[1:], value, full_key)})


def apply_overrides(cfg: ExperimentConfig, overrides: Mapping[str, Any]) -> ExperimentConfig:
    """Return ``cfg`` with each dotted key set; the one function behind presets, YAML, CLI and Tune.

    Values may be typed (YAML, Tune) or strings (``--set``), which are parsed as YAML scalars.
    Unknown keys and ill-typed values raise :class:`ConfigError`; ranges are checked by :func:`validate`.
    A renamed key (:data:`RENAMED_KEYS`) sets its new name, with a :class:`ConfigWarning`.
    """
    for key, value in overrides.items():
        key = current_key(key)
        cfg = _set(cfg, key.split("."), value, key)
    return cfg


def parse_set_args(items: list[str]) -> dict[str, str]:
    """``["a.b=3", "c=x"]`` -> ``{"a.b": "3", "c": "x"}`` (CLI ``--set``)."""
    out: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(item, item, "expected --set key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict (a YAML file) -> dotted keys; a mapping-valued setting (``env.kwargs``) stays whole."""
    mapping_keys = {k for k, tp, _ in iter_fields() if _is_mapping_type(tp)}
    out: dict[str, Any] = {}
    for k, v in mapping.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and key not in mapping_keys:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load_yaml(path: str) -> dict[str, Any]:
    """A YAML settings file as dotted keys; a missing file or a syntax error names the file (line, column)."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as e:
        raise PathError(f"--config {path}: cannot read the YAML file ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"--config {where}: not valid YAML ({what})") from None
    if not isinstance(data, Mapping):
        raise ConfigError("--config", path, "a YAML file must hold a mapping of settings")
    return flatten(data)


def to_flat_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """Every leaf setting by dotted key (MLflow params, checkpoints)."""
    out: dict[str, Any] = {}
    for key, _, _ in iter_fields():
        obj: Any = cfg
        for part in key.split("."):
            obj = getattr(obj, part)
        out[key] = list(obj) if isinstance(obj, tuple) else dict(obj) if isinstance(obj, Mapping) else obj
    return out


def from_flat_dict(flat: Mapping[str, Any]) -> ExperimentConfig:
    return apply_overrides(ExperimentConfig(), flat)


def describe_fields(values: Mapping[str, Any] | None = None, *, source: str = "default") -> str:
    """One line per setting: key, type, value, doc (the CLI's --help epilog). ``values``: a resolved config's
    flat values (a preset's) to show, with the bare default beside each one they change; ``source`` names
    them (e.g. ``"cartpole_muzero"``)."""
    lines = []
    defaults = to_flat_dict(ExperimentConfig())
    for key, tp, f in iter_fields():
        extra = ""
        if f.metadata.get("choices"):
            extra = f" {{{', '.join(map(str, f.metadata['choices']))}}}"
        value = defaults[key] if values is None else values[key]
        shown = f"{source} {value!r}"
        if values is not None and value != defaults[key]:
            shown += f"; default {defaults[key]!r}"
        lines.append(f"  {key} ({_type_name(tp)}, {shown}){extra}: {f.metadata.get('doc', '')}")
    return "\n".join(lines)
