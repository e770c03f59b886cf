"""The user-error family: mistakes in what a user asked for, as opposed to bugs in the library.

Every exception here means "the input is wrong": its message names the input (a file, a folder, a config
key, a command-line option), the value, and what is allowed. The command line prints such an error as one
line and exits with status 2; any other exception is a bug and keeps its traceback.

This module must stay import-light (no torch, Ray or gymnasium): ``config/`` and the CLI import it.
"""

from __future__ import annotations

from typing import Any


class UserError(Exception):
    """A bad input; the message is one line saying which input, its value and what is allowed."""


class PathError(UserError):
    """A path a user gave does not exist or is not what the command needs."""


class CheckpointError(UserError):
    """A checkpoint file is damaged (empty, truncated), not a checkpoint, or of another format version."""

    def __init__(self, path: str, problem: str):
        self.path, self.problem = path, problem
        super().__init__(f"checkpoint {path}: {problem}")


class RunFolderError(UserError):
    """A run folder cannot be used as asked (it holds another run, or later checkpoints would be lost)."""


class ResumeConfigError(UserError):
    """A setting changed on resume that the checkpointed run cannot continue with (e.g. a model shape)."""


class MissingExtraError(UserError):
    """An optional dependency is not installed; the message says which extra to install."""


class DivergedError(UserError):
    """Training diverged: a step's loss or priorities are not finite (the settings that size a step are
    named, since those are what to change)."""


class ConfigWarning(UserWarning):
    """A valid setting that has no effect or does not do what its name suggests (validation warns)."""


class ConfigError(UserError, ValueError):
    """A setting is unknown or out of range; raised before any work starts."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"config key '{key}' = {value!r} is invalid: {allowed}")


class RunFault(RuntimeError):
    """Not an input error: a run stopped on a fault it could not recover from (every actor of a kind lost,
    a learner worker gone); the message is one line naming what was lost, where the run stood and that its
    checkpoints are intact. The command line prints it as one line with exit status 1."""
