"""Token contexts of the UniZero world model and their key/value caches.

What this module owns
    :class:`TokenContext` -- for each batch row, the raw layer-0 tokens of its context window (left-aligned,
    right-padded) and, optionally, the per-layer keys and values those tokens produced; :func:`weights_tag`,
    the fingerprint of the weights a context was computed with; :class:`NodeContextStore`, the per-node
    contexts of one batched tree search (indexed by node like :class:`~muzero_tune.mcts.search.LatentStore`
    stores latents).

What it must never do
    Run the transformer (:mod:`muzero_tune.models.unizero_net` does), or make a cached key usable after the
    weights that computed it changed: a context carries the :func:`weights_tag` of its model and the model
    refuses (recomputes) any context whose tag is not the current one. Keys are never shifted to new
    positions (approximate); a window that slides is recomputed from its raw tokens.

Why a tag and not only explicit clears: in the sync pipeline the collector acts with the learner's own model,
which the optimizer changes in place between collects. ``torch.Tensor._version`` counts in-place writes to a
tensor (optimizer steps, ``load_state_dict``'s ``copy_``, EMA ``lerp_``), so any write to any parameter or
buffer changes the tag; ``cache_epoch`` (bumped by the policy's hooks) covers everything else.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import Tensor

WeightsTag = tuple  # (id(model), cache_epoch, parameter versions, buffer versions)


def weights_tag(model: torch.nn.Module) -> WeightsTag:
    """The fingerprint of ``model``'s current weights (changes on any in-place write to them)."""
    return (
        id(model),
        int(getattr(model, "cache_epoch", 0)),
        tuple(p._version for p in model.parameters()),
        tuple(b._version for b in model.buffers()),
    )


def bump_cache_epoch(model: torch.nn.Module) -> None:
    """Invalidate every context computed with ``model`` so far (its tag changes)."""
    model.cache_epoch = int(getattr(model, "cache_epoch", 0)) + 1


@dataclasses.dataclass(frozen=True, eq=False)
class TokenContext:
    """The context windows of B rows (T = the model's ``max_tokens``, L layers, H heads, dh head size).

    tokens:   [B, T, E] layer-0 token embeddings (observation latents and action embeddings, no positions);
              row b's tokens are ``tokens[b, :length[b]]`` (position j = window index j), the rest padding.
    length:   [B] int64 tokens in each row's window (host array: the sliding-window rule runs on the host).
    keys:     [B, L, H, T, dh] per-layer keys of those tokens, or None (nothing cached).
    values:   [B, L, H, T, dh] per-layer values, or None.
    kv_valid: [B] bool rows whose keys/values may be reused (False: recompute from ``tokens``).
    tag:      :func:`weights_tag` of the model that computed ``tokens`` (and the keys), None when empty.
    """

    tokens: Tensor
    length: np.ndarray
    keys: Tensor | None
    values: Tensor | None
    kv_valid: np.ndarray
    tag: WeightsTag | None

    @staticmethod
    def empty(
        batch: int, *, max_tokens: int, embed_dim: int, device: torch.device, dtype: torch.dtype
    ) -> TokenContext:
        """B rows with no tokens."""
        return TokenContext(
            tokens=torch.zeros((batch, max_tokens, embed_dim), device=device, dtype=dtype),
            length=np.zeros(batch, dtype=np.int64),
            keys=None,
            values=None,
            kv_valid=np.zeros(batch, dtype=bool),
            tag=None,
        )

    @property
    def batch_size(self) -> int:
        return int(self.length.shape[0])

    def rows(self, index: np.ndarray) -> TokenContext:
        """The sub-batch of rows ``index`` [b] (copies)."""
        idx = np.asarray(index, dtype=np.int64)
        ti = torch.as_tensor(idx, device=self.tokens.device)
        return TokenContext(
            tokens=self.tokens[ti],
            length=self.length[idx].copy(),
            keys=None if self.keys is None else self.keys[ti],
            values=None if self.values is None else self.values[ti],
            kv_valid=self.kv_valid[idx].copy(),
            tag=self.tag,
        )

    def with_rows(self, index: np.ndarray, other: TokenContext) -> TokenContext:
        """A new context equal to this one with rows ``index`` [b] replaced by ``other``'s b rows.

        Rows of ``self`` computed under another tag than ``other``'s lose their cached keys (their tokens
        are kept: callers decide from the tag whether to re-embed them)."""
        idx = np.asarray(index, dtype=np.int64)
        ti = torch.as_tensor(idx, device=self.tokens.device)
        tokens = self.tokens.clone()
        tokens[ti] = other.tokens
        length = self.length.copy()
        length[idx] = other.length
        kv_valid = self.kv_valid.copy() if self.tag == other.tag else np.zeros_like(self.kv_valid)
        keys = values = None
        if other.keys is not None:
            if self.keys is None or self.keys.shape[1:] != other.keys.shape[1:]:
                keys = torch.zeros((self.batch_size, *other.keys.shape[1:]), dtype=other.keys.dtype,
                                   device=other.keys.device)  # fmt: skip
                values = torch.zeros_like(keys)
                kv_valid[:] = False
            else:
                keys, values = self.keys.clone(), self.values.clone()
            keys[ti], values[ti] = other.keys, other.values
            kv_valid[idx] = other.kv_valid
        else:
            kv_valid[idx] = False
            keys, values = self.keys, self.values
        return TokenContext(tokens, length, keys, values, kv_valid, other.tag)

    def without_cache(self, index: np.ndarray | None = None) -> TokenContext:
        """The same windows with the cached keys of rows ``index`` (None: all) marked unusable."""
        kv_valid = self.kv_valid.copy()
        if index is None:
            kv_valid[:] = False
        else:
            kv_valid[np.asarray(index, dtype=np.int64)] = False
        return dataclasses.replace(self, kv_valid=kv_valid)


class NodeContextStore:
    """Per-node contexts of one batched search: node n of every tree at row n (node ``s + 1`` is created at
    simulation s in all trees), so the parents of a simulation are gathered with one advanced index.

    Buffers (zero-filled: masked attention must never meet NaN garbage): tokens [Nc, Bc, T, E], keys and
    values [Nc, Bc, L, H, T, dh] (only when the contexts carry keys), lengths and kv_valid [Nc, Bc] on the
    host. Reallocated when a run needs more nodes, a larger batch, or other shapes.
    """

    def __init__(self) -> None:
        self.tokens: Tensor | None = None
        self.keys: Tensor | None = None
        self.values: Tensor | None = None
        self.length = np.zeros((0, 0), dtype=np.int64)
        self.kv_valid = np.zeros((0, 0), dtype=bool)
        self.tag: WeightsTag | None = None

    def clear(self) -> None:
        """Forget every stored context (the buffers are dropped)."""
        self.__init__()

    def reset(self, root: TokenContext, *, num_nodes: int) -> None:
        """Start a search: make room for ``num_nodes`` nodes of ``root.batch_size`` trees, store the roots."""
        bsz = root.batch_size
        t = root.tokens
        fits = (
            self.tokens is not None
            and self.tokens.shape[0] >= num_nodes
            and self.tokens.shape[1] >= bsz
            and self.tokens.shape[2:] == t.shape[1:]
            and self.tokens.dtype == t.dtype
            and self.tokens.device == t.device
            and (root.keys is None) == (self.keys is None)
            and (root.keys is None or self.keys.shape[2:] == root.keys.shape[1:])
        )
        if not fits:
            nodes = num_nodes if self.tokens is None else max(num_nodes, self.tokens.shape[0])
            cap = bsz if self.tokens is None else max(bsz, self.tokens.shape[1])
            self.tokens = torch.zeros((nodes, cap, *t.shape[1:]), dtype=t.dtype, device=t.device)
            if root.keys is not None:
                kshape = (nodes, cap, *root.keys.shape[1:])
                self.keys = torch.zeros(kshape, dtype=root.keys.dtype, device=root.keys.device)
                self.values = torch.zeros_like(self.keys)
            else:
                self.keys = self.values = None
            self.length = np.zeros((nodes, cap), dtype=np.int64)
            self.kv_valid = np.zeros((nodes, cap), dtype=bool)
        self.put(0, root)

    def put(self, node: int, ctx: TokenContext) -> None:
        """Store ``ctx`` (B rows) as node ``node`` of trees 0..B-1."""
        bsz = ctx.batch_size
        self.tokens[node, :bsz].copy_(ctx.tokens)
        self.length[node, :bsz] = ctx.length
        if self.keys is not None and ctx.keys is not None:
            self.keys[node, :bsz].copy_(ctx.keys)
            self.values[node, :bsz].copy_(ctx.values)
            self.kv_valid[node, :bsz] = ctx.kv_valid
        else:
            self.kv_valid[node, :bsz] = False
        self.tag = ctx.tag

    def gather(self, node: np.ndarray) -> TokenContext:
        """The contexts of node ``node[b]`` of tree b, b = 0..B-1 (copies)."""
        node = np.asarray(node, dtype=np.int64)
        bsz = node.shape[0]
        b = np.arange(bsz)
        tn = torch.as_tensor(node, device=self.tokens.device)
        tb = torch.as_tensor(b, device=self.tokens.device)
        return TokenContext(
            tokens=self.tokens[tn, tb],
            length=self.length[node, b].copy(),
            keys=None if self.keys is None else self.keys[tn, tb],
            values=None if self.values is None else self.values[tn, tb],
            kv_valid=self.kv_valid[node, b].copy(),
            tag=self.tag,
        )
