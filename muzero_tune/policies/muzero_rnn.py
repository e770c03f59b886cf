"""MuZero with a recurrent history over full observations: the ``muzero_rnn_full_obs`` policy type.

* **Model** -- :class:`~muzero_tune.models.rnn_net.RNNMuZeroNet`: a MuZero network (MLP or conv) plus a
  GRU history h (``policy.rnn_hidden_size``). The state is (z, h); the representation encodes the
  observation into z, ``h' = GRU([z, one_hot(a)], h)``, and dynamics and prediction receive h too.
* **Acting** -- every root's z is the representation of the real ("full") observation; h is carried per
  env in the acting state (:class:`~muzero_tune.policies.muzero_context.CarriedActState`): at step t of an
  episode h_t = GRU over the previous root and the action taken, reset to zeros at the episode start and
  every ``policy.context_length_init`` = L steps (steps 0, L, 2L, ...). Each step stores its context
  position ``context_step`` = t mod L and the root history ``history`` h_t with the transition.
* **Search** -- the unchanged MuZero search over the *packed* state [flatten(z), h]: one tensor per node,
  unpacked inside the model's dynamics and prediction (MuZero's recurrent_fn).
* **History replay instead of reset.** Wherever the learner needs the history at a stored position p (a
  training root, a bootstrap observation, a reanalyzed root) it rebuilds it the way the collector built
  it, with the weights at hand: from the start of p's window s = p - context_step[p] (h_s = 0), the GRU
  over the representations of the real observations o_s..o_{p-1} and the actions taken. Stored histories
  (computed by older weights) are only used where a window began in an earlier segment (s < 0): the replay
  then starts at position 0 from the stored history there. That never happens when
  ``replay.game_segment_length`` is a multiple of L (segments start at episode steps that are multiples of
  the segment length).
* **Training** -- MuZero's K-step unroll and loss, started from (represent(o_t), h_t) with h_t replayed by
  the online model (gradients flow through the replay, at most L - 1 GRU steps): exactly the root state the
  collector searched from at step t, so the heads are trained on the roots they are used on.
* **Targets** -- MuZero's (:func:`~muzero_tune.replay.targets.make_batch`): the n-step bootstrap value of
  observation b is the target model's value at (represent(o_b), h_b) with h_b replayed by the target model;
  reanalyze inside :meth:`make_batch` (``replay.reanalyze_ratio``) searches from replayed histories too.

The buffer reanalyze entry point (:meth:`reanalyze` through the driver) only receives observations, so it
searches from an empty history.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from muzero_tune.envs.spec import stack_frames
from muzero_tune.models import logits_to_scalar
from muzero_tune.models.rnn_net import RNNMuZeroNet
from muzero_tune.policies.base import SearchRoots, eval_mode, model_device
from muzero_tune.policies.muzero_context import CarriedStatePolicy
from muzero_tune.replay.targets import TrainBatch, make_batch, reanalyze_positions

CONTEXT_STEP = "context_step"  # step stat [] int64: position in the history window (0: h was reset)
HISTORY = "history"  # step stat [H] float32: the root history h the step searched with

# TrainBatch.extras: each sample's history window s..t as a grid of T = context_length_init slots
BURN_OBS = "rnn_burn_obs"  # [B, T, *obs_shape] observations o_s.. (slot j = position s + j; zeros if unused)
BURN_ACTIONS = "rnn_burn_actions"  # [B, T] int64 actions a_s..
BURN_RESET = "rnn_burn_reset"  # [B, T] bool, the history is reset at that slot
BURN_LEN = "rnn_burn_len"  # [B] int64, slots used: t - s + 1
HISTORY0 = "rnn_history0"  # [B, H] float32, the history at slot 0 (zeros unless s was clamped to 0)


@dataclasses.dataclass(frozen=True)
class HistoryGrid:
    """Per row, the stored positions start..start+length-1 of one segment: what a history replay needs."""

    obs: np.ndarray  # [B, T, *obs_shape] stacked observations (zeros past length)
    actions: np.ndarray  # [B, T] int64 actions taken there (0 where none)
    reset: np.ndarray  # [B, T] bool: the history is zero at that position (a window start)
    length: np.ndarray  # [B] int64 positions used (>= 1)
    history0: np.ndarray  # [B, H] float32 history at slot 0 (stored; zeros when slot 0 is a reset)
    start: np.ndarray  # [B] int64 segment position of slot 0


def replay_histories(
    model: RNNMuZeroNet, history0: torch.Tensor, obs, actions, reset, length
) -> torch.Tensor:
    """The history at every slot of a grid [B, T, H] (autograd-friendly: no in-place updates).

    Slot 0 holds ``history0`` (zeros where reset); slot j < length holds zeros where ``reset[:, j]``, else
    GRU([represent_z(obs[:, j-1]), one_hot(actions[:, j-1])], slot j-1). Slots past a row's length repeat
    its last value. One representation call for all the observations needed.
    """
    dev = history0.device
    slots = reset.shape[1]
    j = np.arange(slots)[None, :]
    live = j < np.asarray(length)[:, None]  # [B, T]
    # slot j+1 steps from slot j's observation unless it is a reset or past the length
    steps = np.zeros_like(live)
    steps[:, :-1] = live[:, 1:] & ~reset[:, 1:]
    rows, cols = np.nonzero(steps)
    z = model.represent_z(torch.as_tensor(obs[rows, cols], device=dev)) if rows.size else None
    a = torch.as_tensor(actions[rows, cols], device=dev)
    keep = torch.as_tensor(~(live & reset), device=dev, dtype=history0.dtype)  # [B, T]: 0 where reset
    h = history0 * keep[:, 0:1]
    out = [h]
    for col in range(1, slots):
        sel = np.flatnonzero(cols == col - 1)
        if sel.size:
            r = torch.as_tensor(rows[sel], device=dev)
            s = torch.as_tensor(sel, device=dev)
            h = h.index_copy(0, r, model.history(model.pack(z[s], h[r]), a[s]).to(h.dtype))
        h = h * keep[:, col : col + 1]
        out.append(h)
    return torch.stack(out, dim=1)


class _RootHistory:
    """``model`` whose :meth:`initial_inference` starts from ``history``; everything else is the model's.

    Lets MuZero's loss run unchanged from a reconstructed root state.
    """

    def __init__(self, model: RNNMuZeroNet, history: torch.Tensor):
        self._model = model
        self._history = history

    def initial_inference(self, obs: torch.Tensor):
        return self._model.initial_inference(obs, self._history)

    def __getattr__(self, name: str):
        return getattr(self._model, name)


class MuZeroRNNFullObsPolicy(CarriedStatePolicy):
    """MuZero with a GRU history carried over real observations (module docstring)."""

    name = "muzero_rnn_full_obs"
    ssl_latent_seam = False  # its loss runs on a history-replaying wrapper of the model

    # ---------------------------------------------------------------- model and acting

    def build_model(self) -> RNNMuZeroNet:
        return RNNMuZeroNet(super().build_model(), history_size=self.cfg.policy.rnn_hidden_size)

    def step_stat_names(self) -> tuple[str, ...]:
        return (*super().step_stat_names(), CONTEXT_STEP, HISTORY)

    def carried_root(self, model, obs, state, env_index):
        context_step = state.step[env_index] % self.context_length  # [B]
        z = model.represent_z(obs)
        h = model.zero_history(len(obs), like=z)
        carry = context_step != 0
        if state.latent is not None and carry.any():
            dev = z.device
            src = env_index[carry]  # the carrying envs' rows in the state
            prev = state.latent[torch.as_tensor(src, device=dev)]  # the root each searched from last step
            h[torch.as_tensor(np.flatnonzero(carry), device=dev)] = model.history(
                prev, torch.as_tensor(state.action[src], device=dev)
            )
        extra = {CONTEXT_STEP: context_step.astype(np.int64), HISTORY: h.float().cpu().numpy()}
        return model.pack(z, h), extra

    def reanalyze(self, target_model, obs, legal_mask, rng, history: np.ndarray | None = None) -> np.ndarray:
        """Visit distributions from roots (represent(obs), ``history`` [N, H]; None: empty histories)."""
        with eval_mode(target_model):
            dev = model_device(target_model)
            h = None if history is None else torch.as_tensor(history, device=dev, dtype=torch.float32)
            root = target_model.represent(torch.as_tensor(obs, device=dev), h)
            value_logits, policy_logits = target_model.predict(root)
            out, _ = self.run_search(
                target_model, SearchRoots(root, policy_logits, value_logits), legal_mask,
                add_noise=True, deterministic=False, rng=rng,
            )  # fmt: skip
        return out.visit_distribution.astype(np.float32)

    # ---------------------------------------------------------------- targets

    def history_value_fn(self, model: RNNMuZeroNet, history: np.ndarray, *, chunk: int = 2048):
        """``obs [n, ...] -> value [n]`` at the states (represent(obs), the next n rows of ``history``
        [N, H]): the N bootstrap positions in order, in one call or consecutive pieces (``ValueFn``), from
        the first again once all N are read."""
        dev = model_device(model)
        start = [0]  # the history row of the next call's first observation

        def fn(obs: np.ndarray) -> np.ndarray:
            lo_h = start[0]
            hi_h = lo_h + len(obs)
            if hi_h > len(history):
                raise RuntimeError(
                    f"value_fn got {len(obs)} observations from position {lo_h} of {len(history)} histories"
                )
            start[0] = 0 if hi_h == len(history) else hi_h
            rows = history[lo_h:hi_h]
            vals = []
            with eval_mode(model):
                for lo in range(0, len(obs), chunk):
                    h = torch.as_tensor(rows[lo : lo + chunk], device=dev, dtype=torch.float32)
                    root = model.initial_inference(torch.as_tensor(obs[lo : lo + chunk], device=dev), h)
                    vals.append(
                        logits_to_scalar(root.value_logits.float(), support_size=model.value_support_size)
                    )
            return torch.cat(vals).cpu().numpy() if vals else np.zeros(0, dtype=np.float32)

        return fn

    def _context_steps(self, seg) -> np.ndarray:
        """Context position of observations 0..M of ``seg`` [M + 1] (M: one past its last step)."""
        ctx = seg.stats[CONTEXT_STEP]
        return np.append(ctx, (int(ctx[-1]) + 1) % self.context_length)

    def history_grid(
        self, segments, first: np.ndarray, last: np.ndarray, *, min_slots: int = 1
    ) -> HistoryGrid:
        """Per row, positions from the start of ``first``'s window through ``last`` (first <= last <= M)."""
        bsz = len(segments)
        ctx = [self._context_steps(seg) for seg in segments]
        start = np.array([max(int(f) - int(c[int(f)]), 0) for f, c in zip(first, ctx)], dtype=np.int64)
        length = np.asarray(last, dtype=np.int64) - start + 1
        slots = max(int(length.max(initial=1)), min_slots)
        fs = segments[0].frame_stack
        one = segments[0].frames[np.zeros(1, dtype=np.int64)]  # frames may be a FrameRef: read one for dtype
        frames = np.zeros((bsz, slots, fs, *one.shape[1:]), dtype=one.dtype)
        actions = np.zeros((bsz, slots), dtype=np.int64)
        reset = np.zeros((bsz, slots), dtype=bool)
        history0 = np.zeros((bsz, self.cfg.policy.rnn_hidden_size), dtype=np.float32)
        window = np.arange(fs)
        for r, (seg, c) in enumerate(zip(segments, ctx)):
            s, n, m = int(start[r]), int(length[r]), seg.num_stored
            pos = np.arange(s, s + n)
            frames[r, :n] = seg.frames[pos[:, None] + window]
            steps = pos[pos < m]
            actions[r, : len(steps)] = seg.actions[steps]
            reset[r, :n] = c[pos] == 0
            if c[s] != 0:  # the window began in an earlier segment: the collector's stored history
                history0[r] = seg.stats[HISTORY][s]
        return HistoryGrid(stack_frames(frames, frame_ndim=self.spec.frame_ndim), actions, reset, length,
                           history0, start)

    def _replay(self, model: RNNMuZeroNet, grid: HistoryGrid) -> np.ndarray:
        """``replay_histories`` of a grid with ``model`` in eval mode, no grad -> [B, T, H] numpy."""
        with eval_mode(model):
            h0 = torch.as_tensor(grid.history0, device=model_device(model))
            hs = replay_histories(model, h0, grid.obs, grid.actions, grid.reset, grid.length)
        return hs.float().cpu().numpy()

    def bootstrap_histories(self, sample, target_model: RNNMuZeroNet) -> np.ndarray:
        """The replayed history at every bootstrap observation, in the order make_batch asks value_fn.

        Unroll index i = t + k (k = 0..K) bootstraps from observation b = i + min(td, M - i) (td: the
        sample's horizon, :meth:`td_steps_of`) when i < M and b is not the terminal state (the rule of
        :func:`~muzero_tune.replay.targets.make_batch`; value_fn checks the count). One replay per sample
        covers all its bootstrap observations.
        """
        rc = self.cfg.replay
        segs = sample.segments
        m = np.fromiter((s.num_stored for s in segs), dtype=np.int64, count=len(segs))[:, None]  # [B, 1]
        terminal = np.fromiter((s.terminal_at_end for s in segs), dtype=bool, count=len(segs))[:, None]
        i = np.asarray(sample.positions, dtype=np.int64)[:, None] + np.arange(rc.num_unroll_steps + 1)
        td = np.broadcast_to(np.asarray(self.td_steps_of(sample)), (len(segs),))[:, None]  # [B, 1]
        b = i + np.clip(np.minimum(td, m - i), 0, None)  # [B, K+1] bootstrap observations
        ok = (i < m) & ~((b == m) & terminal)
        rows = np.flatnonzero(ok.any(axis=1))
        if rows.size == 0:
            return np.zeros((0, self.cfg.policy.rnn_hidden_size), dtype=np.float32)
        first = np.array([b[r][ok[r]][0] for r in rows])
        last = np.array([b[r][ok[r]][-1] for r in rows])
        grid = self.history_grid([segs[r] for r in rows], first, last)
        hs = self._replay(target_model, grid)
        row_of = np.zeros(len(segs), dtype=np.int64)
        row_of[rows] = np.arange(rows.size)
        rr, kk = np.nonzero(ok)  # row-major, like make_batch's boolean gather
        g = row_of[rr]
        return hs[g, b[rr, kk] - grid.start[g]]

    def make_batch(
        self, sample, *, target_model, rng, reanalyze_count=0, defer_bootstrap=False
    ) -> TrainBatch:
        rc = self.cfg.replay
        if reanalyze_count > 0:
            self._reanalyze_with_history(sample, reanalyze_count, target_model, rng)
        batch = make_batch(
            sample,
            num_unroll_steps=rc.num_unroll_steps,
            td_steps=self.td_steps_of(sample),
            discount=self.cfg.mcts.discount,
            num_actions=self.spec.num_actions,
            value_fn=self.history_value_fn(target_model, self.bootstrap_histories(sample, target_model)),
            rng=rng,
            all_obs=self.cfg.learn.ssl_loss_weight > 0,
            defer_bootstrap=defer_bootstrap,
        )
        t = np.asarray(sample.positions, dtype=np.int64)
        grid = self.history_grid(sample.segments, t, t, min_slots=self.context_length)  # the roots' windows
        burn = {BURN_OBS: grid.obs, BURN_ACTIONS: grid.actions, BURN_RESET: grid.reset, BURN_LEN: grid.length,
                HISTORY0: grid.history0}
        return dataclasses.replace(batch, extras={**batch.extras, **burn})

    def _reanalyze_with_history(self, sample, count: int, target_model, rng) -> None:
        """make_batch's reanalyze (positions t..t+K within the data, first ``count`` samples), replayed h."""
        segs, positions = sample.segments[:count], np.asarray(sample.positions[:count], dtype=np.int64)
        span = self.cfg.replay.num_unroll_steps + 1
        last = np.array([min(int(t) + span, seg.num_stored) - 1 for seg, t in zip(segs, positions)])
        grid = self.history_grid(segs, positions, last)
        hs = self._replay(target_model, grid)
        history = np.concatenate(
            [hs[r, positions[r] - grid.start[r] : last[r] - grid.start[r] + 1] for r in range(len(segs))]
        )

        def fn(obs: np.ndarray, legal: np.ndarray) -> np.ndarray:
            if len(obs) != len(history):
                raise RuntimeError(f"reanalyze got {len(obs)} observations for {len(history)} histories")
            return self.reanalyze(target_model, obs, legal, rng, history=history)

        reanalyze_positions(segs, positions, span=span, reanalyze_fn=fn)

    # ---------------------------------------------------------------- loss

    def root_history(self, model: RNNMuZeroNet, batch: TrainBatch) -> torch.Tensor:
        """The root history h_t [B, H] of each sample, replayed by ``model`` over its window (with grad)."""
        ex = batch.extras
        h0 = torch.as_tensor(ex[HISTORY0], device=model_device(model))
        hs = replay_histories(model, h0, ex[BURN_OBS], ex[BURN_ACTIONS], ex[BURN_RESET], ex[BURN_LEN])
        last = torch.as_tensor(ex[BURN_LEN] - 1, device=hs.device)
        return hs[torch.arange(hs.shape[0], device=hs.device), last]

    def eager_loss_inputs(self, model, batch: TrainBatch) -> dict[str, torch.Tensor]:
        """The root histories: their replay indexes the window grid by the data (numpy)."""
        return {"root_history": self.root_history(model, batch)}

    def compute_loss(self, model, batch: TrainBatch, *, train_iter: int, root_history=None):
        """MuZero's loss from each sample's root history h_t [B, H] (``root_history``; replayed here when
        not given)."""
        if root_history is None:
            root_history = self.root_history(model, batch)
        return super().compute_loss(_RootHistory(model, root_history), batch, train_iter=train_iter)
