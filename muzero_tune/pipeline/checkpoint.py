"""Checkpoint files: atomic writes, ``torch.load(weights_only=True)`` loading, and loading a policy back.

A checkpoint is a dict of tensors and builtins only (numpy arrays are converted to tensors), so it loads
with ``weights_only=True``:

- ``format``: ``"muzero_tune.checkpoint/1"``
- ``config``: the flat config (dotted key -> value)
- ``evaluated``: ``{"weights", "version", "weights_digest", "metrics"}`` -- the exact weights the evaluator
  used (``weights_digest``: what the evaluator actor reported for them; "" from the sync pipeline)
- ``resume`` (optional): learner state (model, target model, optimizer, scheduler, RNG states),
  ``counters`` (env_steps, train_iter, eval_index, train_epoch), driver RNG state and, when configured,
  the replay buffer.
- ``report_keys`` (Tune trials): the trial's report schema, so a restored trial reports the same keys.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import torch

FORMAT = "muzero_tune.checkpoint/1"


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


def save_checkpoint(path: str, payload: dict) -> int:
    """Write ``payload`` atomically (temp file + rename); returns bytes written."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(to_torch_tree(payload), f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return os.path.getsize(path)


def load_checkpoint(path: str) -> dict:
    """Load a checkpoint file (or the newest ``eval_*.pt`` in a run's ``ckpt`` folder) safely."""
    if os.path.isdir(path):
        path = latest_checkpoint(path)
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise ValueError(f"{path} is not a muzero_tune checkpoint (format {FORMAT})")
    return ckpt


def latest_checkpoint(folder: str) -> str:
    for cand in (folder, os.path.join(folder, "ckpt")):
        if os.path.isdir(cand):
            files = sorted(f for f in os.listdir(cand) if f.startswith("eval_") and f.endswith(".pt"))
            if files:
                return os.path.join(cand, files[-1])
    raise FileNotFoundError(f"no eval_*.pt checkpoint under {folder}")


def load_policy(path: str, *, device: str = "cpu"):
    """Load a checkpoint's evaluated snapshot into a ready policy.

    Returns ``(cfg, policy, model, checkpoint)``; act with ``policy.act(model, obs, mask, explore=False,
    temperature=0, rng=...)`` or evaluate with :class:`muzero_tune.pipeline.evaluator.Evaluator`.
    """
    from muzero_tune.config import from_flat_dict
    from muzero_tune.envs import env_spec
    from muzero_tune.policies.registry import get_policy_class

    ckpt = load_checkpoint(path)
    cfg = from_flat_dict(ckpt["config"])
    spec = env_spec(
        cfg.env.env_id,
        frame_stack=cfg.env.frame_stack,
        frame_size_px=cfg.env.frame_size_px,
        grayscale=cfg.env.grayscale,
    )
    policy = get_policy_class(cfg.policy.type)(cfg, spec)
    model = policy.build_model().to(device)
    model.load_state_dict(ckpt["evaluated"]["weights"])
    model.eval()
    policy.on_weights_loaded(model)
    return cfg, policy, model, ckpt
