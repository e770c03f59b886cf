"""Checkpoint files: durable atomic writes, safe loading, finding a checkpoint from what a user has.

A checkpoint is a dict of tensors and builtins only (numpy arrays are converted to tensors), so it loads
with ``torch.load(weights_only=True)``:

- ``format``: ``"muzero_tune.checkpoint/1"``
- ``config``: the flat config (dotted key -> value)
- ``evaluated``: ``{"weights", "version", "weights_digest", "metrics"}`` -- the exact weights the evaluator
  used (``weights_digest``: what the evaluator actor reported for them; "" from the sync pipeline)
- ``resume`` (optional): learner state (model, target model, optimizer, scheduler, RNG states),
  ``counters`` (env_steps, train_iter, eval_index, train_epoch), driver RNG state and, when configured,
  the replay buffer.
- ``report_keys`` (Tune trials): the trial's report schema, so a restored trial reports the same keys.

:func:`find_checkpoint` accepts every path a user has: a standalone run folder (``<run>``), its ``ckpt``
folder, an ``eval_*.pt`` file, a Tune trial folder, a Tune ``checkpoint_*`` folder or its ``checkpoint.pt``.
In a folder it takes the newest intact checkpoint and reports the damaged newer ones it skipped. A damaged
or foreign file raises :class:`~muzero_tune.errors.CheckpointError` naming the file and what is wrong.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from muzero_tune.errors import CheckpointError, PathError
from muzero_tune.models.layout import place_model

FORMAT = "muzero_tune.checkpoint/1"
FORMAT_PREFIX = "muzero_tune.checkpoint/"
TUNE_CHECKPOINT_FILE = "checkpoint.pt"  # the file inside a Tune checkpoint_* folder
_REQUIRED_KEYS = ("config", "evaluated")
_EVAL_FILE = re.compile(r"^eval_(\d+)\.pt$")
_TUNE_DIR = re.compile(r"^checkpoint_(\d+)$")
PATH_FORMS = (
    "a run folder, its ckpt/eval_*.pt file, a Tune trial folder, a Tune checkpoint_* folder or its "
    "checkpoint.pt"
)


def to_torch_tree(obj: Any) -> Any:
    """Recursively convert numpy arrays / scalars to tensors / builtins (weights_only-safe)."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: to_torch_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_torch_tree(v) for v in obj]
    return obj


def to_numpy_tree(obj: Any) -> Any:
    """Inverse of :func:`to_torch_tree` for buffer states."""
    if isinstance(obj, torch.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        return {k: to_numpy_tree(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_numpy_tree(v) for v in obj]
    return obj


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(path: str, payload: dict) -> int:
    """Write ``payload`` durably and atomically; returns bytes written.

    The bytes go to a temp file in the same folder, which is fsynced (file and folder) before it is renamed
    over ``path`` and the folder is fsynced again: a crash at any point leaves either the old file or the
    complete new one, never a partial newest checkpoint.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(to_torch_tree(payload), f)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(folder)
        os.replace(tmp, path)
        _fsync_dir(folder)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return os.path.getsize(path)


def load_checkpoint(path: str) -> dict:
    """Load one checkpoint file (or, for a folder, its newest intact checkpoint) with ``weights_only=True``.

    Raises :class:`CheckpointError` (empty, truncated, not a checkpoint, another format version) naming the
    file, or :class:`PathError` for a missing path.
    """
    if os.path.isdir(path):
        return find_checkpoint(path).checkpoint
    return _load_file(path)


def _load_file(path: str) -> dict:
    if not os.path.exists(path):
        raise PathError(f"{path}: no such file; expected {PATH_FORMS}")
    size = os.path.getsize(path)
    if size == 0:
        raise CheckpointError(path, "the file is empty (0 bytes): damaged, e.g. by a crash or a full disk")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # any failure to read the file is a problem of the file, reported as such
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic == b"PK\x03\x04":
            reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
            raise CheckpointError(
                path, f"truncated or corrupt ({size} bytes; torch cannot read it: {reason})"
            ) from None
        raise CheckpointError(
            path, "not a muzero_tune checkpoint (not a file written by torch.save)"
        ) from None
    if not isinstance(ckpt, dict) or "format" not in ckpt:
        raise CheckpointError(path, f"not a muzero_tune checkpoint (no 'format' key; expected {FORMAT!r})")
    fmt = ckpt["format"]
    if fmt != FORMAT:
        if isinstance(fmt, str) and fmt.startswith(FORMAT_PREFIX):
            raise CheckpointError(
                path,
                f"format version {fmt!r}; this muzero_tune reads {FORMAT!r} (use the version that wrote it)",
            )
        raise CheckpointError(path, f"not a muzero_tune checkpoint (format {fmt!r}; expected {FORMAT!r})")
    missing = [k for k in _REQUIRED_KEYS if k not in ckpt]
    if missing:
        raise CheckpointError(path, f"damaged: missing {', '.join(map(repr, missing))}")
    return ckpt


@dataclass(frozen=True)
class FoundCheckpoint:
    """The checkpoint :func:`find_checkpoint` chose for a user's path."""

    path: str  # the checkpoint file loaded
    checkpoint: dict
    skipped: tuple[tuple[str, str], ...] = ()  # newer checkpoints that are damaged: (file, problem)
    run_dir: str | None = None  # the standalone run folder holding it (<run>/ckpt/eval_*.pt), else None

    @property
    def eval_index(self) -> int:
        return int(self.checkpoint.get("resume", {}).get("counters", {}).get("eval_index", 0))


def run_dir_of(checkpoint_file: str) -> str | None:
    """``<run>`` for ``<run>/ckpt/eval_*.pt`` when ``<run>`` is a standalone run folder, else None."""
    ckpt_dir = os.path.dirname(os.path.abspath(checkpoint_file))
    if os.path.basename(ckpt_dir) != "ckpt" or not _EVAL_FILE.match(os.path.basename(checkpoint_file)):
        return None
    run = os.path.dirname(ckpt_dir)
    return run if os.path.exists(os.path.join(run, "config.json")) else None


def eval_checkpoints(ckpt_dir: str) -> list[str]:
    """The ``eval_*.pt`` files of a run's ``ckpt`` folder, oldest first (by eval index)."""
    if not os.path.isdir(ckpt_dir):
        return []
    files = [(int(m.group(1)), f) for f in os.listdir(ckpt_dir) if (m := _EVAL_FILE.match(f))]
    return [os.path.join(ckpt_dir, f) for _, f in sorted(files)]


def _candidates(folder: str) -> list[str]:
    """Checkpoint files in ``folder`` (any of the folder forms), newest first."""
    if os.path.isfile(os.path.join(folder, TUNE_CHECKPOINT_FILE)):  # a Tune checkpoint_* folder
        return [os.path.join(folder, TUNE_CHECKPOINT_FILE)]
    for cand in (os.path.join(folder, "ckpt"), folder):  # a run folder or its ckpt folder
        files = eval_checkpoints(cand)
        if files:
            return files[::-1]
    tune_dirs = [(int(m.group(1)), d) for d in os.listdir(folder) if (m := _TUNE_DIR.match(d))]
    files = [os.path.join(folder, d, TUNE_CHECKPOINT_FILE) for _, d in sorted(tune_dirs, reverse=True)]
    return [f for f in files if os.path.exists(f)]  # a Tune trial folder


def find_checkpoint(path: str) -> FoundCheckpoint:
    """The checkpoint a user's ``path`` names (see the module docstring for the accepted forms)."""
    if not os.path.exists(path):
        raise PathError(f"{path}: no such file or folder; expected {PATH_FORMS}")
    if not os.path.isdir(path):
        return FoundCheckpoint(path, _load_file(path), (), run_dir_of(path))
    files = _candidates(path)
    if not files:
        hint = ""
        if os.path.exists(os.path.join(path, "muzero_tune_sweep.json")):
            hint = " (this is a sweep folder: pass one of its trial folders, or `muzero-tune resume` it)"
        raise PathError(f"{path}: no checkpoint in this folder{hint}; expected {PATH_FORMS}")
    skipped: list[tuple[str, str]] = []
    for f in files:
        try:
            ckpt = _load_file(f)
        except CheckpointError as e:
            skipped.append((f, e.problem))
            continue
        return FoundCheckpoint(f, ckpt, tuple(skipped), run_dir_of(f))
    raise CheckpointError(files[0], f"damaged ({skipped[0][1]}), and no older checkpoint in {path} is intact")


def latest_checkpoint(folder: str) -> str:
    """The newest intact checkpoint file under ``folder`` (any folder form of :func:`find_checkpoint`)."""
    return find_checkpoint(folder).path


# Sections a re-evaluation may override: how the snapshot searches and is evaluated, never what it is.
EVAL_OVERRIDE_SECTIONS = ("eval", "mcts")


def policy_from_checkpoint(ckpt: dict, *, device: str = "cpu", overrides: dict[str, Any] | None = None):
    """A loaded checkpoint's evaluated snapshot in a ready policy: ``(cfg, policy, model)``.

    ``overrides``: dotted ``eval.*`` / ``mcts.*`` keys applied to the run's config (e.g.
    ``{"eval.unvisited_q": "min"}``, ``{"mcts.num_simulations": 100}``), validated; any other section is a
    ``ConfigError``.
    """
    from muzero_tune.config import ConfigError, apply_overrides, from_flat_dict, validate
    from muzero_tune.envs import spec_of
    from muzero_tune.policies.registry import get_policy_class

    cfg = from_flat_dict(ckpt["config"])
    if overrides:
        for key, value in overrides.items():
            if key.split(".")[0] not in EVAL_OVERRIDE_SECTIONS:
                allowed = ", ".join(f"{s}.*" for s in EVAL_OVERRIDE_SECTIONS)
                raise ConfigError(key, value, f"a checkpoint is re-evaluated with {allowed} keys only")
        cfg = validate(apply_overrides(cfg, overrides), check_env=False)
    spec = spec_of(cfg.env)
    policy = get_policy_class(cfg.policy.type)(cfg, spec)
    model = place_model(policy.build_model(), device=device, channels_last=cfg.model.channels_last)
    model.load_state_dict(ckpt["evaluated"]["weights"])
    model.eval()
    policy.on_weights_loaded(model)
    return cfg, policy, model


def load_policy(path: str, *, device: str = "cpu", overrides: dict[str, Any] | None = None):
    """Load a checkpoint's evaluated snapshot into a ready policy (``path``: see :func:`find_checkpoint`;
    ``overrides``: see :func:`policy_from_checkpoint`).

    Returns ``(cfg, policy, model, checkpoint)``; act with ``policy.act(model, obs, mask, explore=False,
    temperature=0, rng=...)`` or evaluate with :class:`muzero_tune.pipeline.evaluator.Evaluator`.
    """
    ckpt = find_checkpoint(path).checkpoint
    cfg, policy, model = policy_from_checkpoint(ckpt, device=device, overrides=overrides)
    return cfg, policy, model, ckpt
