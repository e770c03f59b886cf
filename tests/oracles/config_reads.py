"""Which settings a run reads: attribute reads of the config tree's sections, made by the library's own code
outside the config package and the command line, while a block runs.

:func:`recording` replaces ``__getattribute__`` of every section class (the frozen dataclasses
:func:`muzero_tune.config.iter_fields` walks) for the duration of the block. A read counts where the frame
that made it is a module of ``muzero_tune`` other than ``muzero_tune.config`` (validation, flat dicts and
overrides read every key and prove nothing) and ``muzero_tune.cli`` (which reads a few keys to word its
lines). Reads the standard library makes on the library's behalf do not count either (``dataclasses.replace``
copying fields it was not asked to change, ``repr``, pickling). Reads in other processes (Ray actors) are
not seen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import typing
from collections.abc import Iterator

from muzero_tune.config import ExperimentConfig, iter_fields


def _section_types(cls: type = ExperimentConfig, prefix: str = "") -> dict[type, str]:
    """Section class -> its dotted prefix ("" for the top level)."""
    out = {cls: prefix}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out.update(_section_types(hints[f.name], f"{prefix}{f.name}."))
    return out


SECTIONS = _section_types()
LEAVES = {k for k, _, _ in iter_fields()}


def _counts(module: str) -> bool:
    return module.startswith("muzero_tune.") and not (
        module in ("muzero_tune.config", "muzero_tune.cli") or module.startswith("muzero_tune.config.")
    )


@contextlib.contextmanager
def recording() -> Iterator[set[str]]:
    """Within the block, the set it yields fills with the dotted keys the library's code reads."""
    reads: set[str] = set()
    saved = {cls: cls.__dict__.get("__getattribute__") for cls in SECTIONS}

    def install(cls: type, prefix: str) -> None:
        base = object.__getattribute__

        def __getattribute__(self, name, _prefix=prefix, _get=sys._getframe):  # noqa: N807
            key = _prefix + name
            if key in LEAVES and _counts(_get(1).f_globals.get("__name__", "")):
                reads.add(key)
            return base(self, name)

        cls.__getattribute__ = __getattribute__

    for cls, prefix in SECTIONS.items():
        install(cls, prefix)
    try:
        yield reads
    finally:
        for cls, old in saved.items():
            if old is None:
                del cls.__getattribute__
            else:  # pragma: no cover - the sections define none of their own
                cls.__getattribute__ = old


__all__ = ["LEAVES", "SECTIONS", "recording"]
