"""UniZero's KV caches are exact: cached inference equals recomputing the whole window (fp32, 1e-5), over
random sequences with sliding-window overflow, episode starts in the middle of a batch, rows that do not act
at every step, per-node search caches and left padding; and a cache filled by other weights is never used."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from muzero_tune.models.kv_cache import NodeContextStore, TokenContext, bump_cache_epoch, weights_tag
from muzero_tune.models.unizero_net import UniZeroNet

TOL = 1e-5


def _net(positional: str, *, max_tokens: int = 11, seed: int = 0) -> UniZeroNet:
    torch.set_num_threads(1)  # as every pipeline process runs (two threads are far slower here)
    torch.manual_seed(seed)
    net = UniZeroNet(obs_shape=(4,), num_actions=3, embed_dim=32, num_layers=2, num_heads=2,
                     max_tokens=max_tokens, positional=positional).eval()  # fmt: skip
    for p in net.parameters():  # non-trivial heads and attention everywhere
        p.data.normal_(0.0, 0.3)
    return net


def _window(seq: list[torch.Tensor], limit: int) -> list[torch.Tensor]:
    """The reference sliding-window rule: drop the oldest tokens two at a time until <= limit remain."""
    drop = max(len(seq) - limit, 0)
    drop += drop % 2
    return seq[drop:]


def _reference(net: UniZeroNet, windows: list[list[torch.Tensor]]) -> torch.Tensor:
    """Uncached: every row's whole window, left-padded into one batch; the output at its last token."""
    width = max(len(w) for w in windows)
    e = net.embed_dim
    tokens = torch.zeros((len(windows), width, e))
    valid = torch.zeros((len(windows), width), dtype=torch.bool)
    for r, w in enumerate(windows):
        if w:
            tokens[r, width - len(w) :] = torch.stack(w)
            valid[r, width - len(w) :] = True
    return net.forward_sequence(tokens, valid)[:, -1]


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_left_padding_equals_unpadded_rows(positional):
    net = _net(positional)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randn(n, 32, generator=g) for n in (1, 4, 7, 11)]
    with torch.no_grad():
        batched = _reference(net, [list(r) for r in rows])
        for r, row in enumerate(rows):
            alone = net.forward_sequence(row[None])[0, -1]
            torch.testing.assert_close(batched[r], alone, atol=TOL, rtol=0)


@pytest.mark.parametrize("positional", ["learned", "rope"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_root_steps_cached_equal_recomputed_window(positional, use_cache):
    """Per-env root contexts over 40 steps: random episode ends, random acting subsets, overflow of the
    7-token root window (context 8 tokens)."""
    net = _net(positional)
    n_env, limit = 5, 7
    rng = np.random.default_rng(0)
    g = torch.Generator().manual_seed(0)
    ctx = TokenContext.empty(n_env, max_tokens=net.max_tokens, embed_dim=32, device=torch.device("cpu"),
                             dtype=torch.float32)  # fmt: skip
    seqs: list[list[torch.Tensor]] = [[] for _ in range(n_env)]
    started = np.zeros(n_env, dtype=bool)
    cached_rows = 0
    with torch.no_grad():
        for _ in range(40):
            env_index = np.flatnonzero(rng.random(n_env) < 0.8)
            if env_index.size == 0:
                continue
            for i in env_index:  # an episode ends (in the middle of the batch): its context restarts
                if rng.random() < 0.1:
                    seqs[i], started[i] = [], False
            sub = ctx.rows(env_index)
            new = torch.zeros((len(env_index), 2, 32))
            new_len = np.zeros(len(env_index), dtype=np.int64)
            for r, i in enumerate(env_index):
                if not started[i]:
                    sub = _emptied(sub, r)
                toks = ([torch.randn(32, generator=g)] if started[i] else []) + [torch.randn(32, generator=g)]
                new[r, : len(toks)] = torch.stack(toks)
                new_len[r] = len(toks)
                seqs[i] = _window(seqs[i] + toks, limit)
                started[i] = True
            cached_rows += int((sub.kv_valid & (sub.length + new_len <= limit)).sum())
            out, sub2 = net.extend(sub, new, new_len, limit=limit, use_cache=use_cache)
            got = out[torch.arange(len(env_index)), torch.as_tensor(new_len - 1)]
            want = _reference(net, [seqs[i] for i in env_index])
            torch.testing.assert_close(got, want, atol=TOL, rtol=0)
            assert list(sub2.length) == [len(seqs[i]) for i in env_index]
            ctx = ctx.with_rows(env_index, sub2)
    assert (cached_rows > 20) == use_cache  # the cached path was really taken


def _emptied(ctx: TokenContext, row: int) -> TokenContext:
    length, kv_valid = ctx.length.copy(), ctx.kv_valid.copy()
    length[row], kv_valid[row] = 0, False
    return TokenContext(ctx.tokens, length, ctx.keys, ctx.values, kv_valid, ctx.tag)


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_search_node_caches_equal_recomputed_windows(positional):
    """A search-like expansion: each simulation extends a random earlier node of every tree by an action token
    and then an observation token, through a NodeContextStore; deep nodes overflow max_tokens and slide."""
    net = _net(positional, max_tokens=9)
    bsz, sims = 4, 30
    g = torch.Generator().manual_seed(2)
    rng = np.random.default_rng(2)
    roots = [[torch.randn(32, generator=g) for _ in range(n)] for n in (1, 3, 7, 5)]
    store = NodeContextStore()
    with torch.no_grad():
        width = max(len(r) for r in roots)
        new = torch.zeros((bsz, width, 32))
        for b, r in enumerate(roots):
            new[b, : len(r)] = torch.stack(r)
        lens = np.array([len(r) for r in roots])
        empty = TokenContext.empty(bsz, max_tokens=9, embed_dim=32, device=torch.device("cpu"),
                                   dtype=torch.float32)  # fmt: skip
        _, root = net.extend(empty, new, lens, limit=7)
        store.reset(root, num_nodes=sims + 1)
        seqs = {(0, b): roots[b] for b in range(bsz)}
        for s in range(sims):
            parent = np.array([rng.integers(0, s + 1) for _ in range(bsz)])
            ctx = store.gather(parent)
            a = torch.randn(bsz, 1, 32, generator=g)
            h1, ctx1 = net.extend(ctx, a, limit=9)
            z = torch.tanh(h1)  # stands in for the next-latent head
            h2, ctx2 = net.extend(ctx1, z, limit=9)
            store.put(s + 1, ctx2)
            w1 = [_window(seqs[(int(p), b)] + [a[b, 0]], 9) for b, p in enumerate(parent)]
            w2 = [_window(w + [z[b, 0]], 9) for b, w in enumerate(w1)]
            torch.testing.assert_close(h1[:, 0], _reference(net, w1), atol=TOL, rtol=0)
            torch.testing.assert_close(h2[:, 0], _reference(net, w2), atol=TOL, rtol=0)
            for b in range(bsz):
                seqs[(s + 1, b)] = w2[b]
        assert max(len(v) for v in seqs.values()) == 9  # windows did fill and slide


def test_context_of_other_weights_is_never_used():
    net = _net("learned")
    other = copy.deepcopy(net)
    g = torch.Generator().manual_seed(3)
    toks = torch.randn(2, 3, 32, generator=g)
    empty = TokenContext.empty(
        2, max_tokens=11, embed_dim=32, device=torch.device("cpu"), dtype=torch.float32
    )
    with torch.no_grad():
        _, ctx = net.extend(empty, toks, limit=7)
        tag = weights_tag(net)
        assert ctx.tag == tag
        net.blocks[0].qkv.weight.add_(0.1)  # an in-place write (optimizer step, load_state_dict, EMA)
        assert weights_tag(net) != tag
        nxt = torch.randn(2, 1, 32, generator=g)
        out, ctx2 = net.extend(ctx, nxt, limit=7)
        # the stale context is void: the output is that of the new token alone under the new weights
        torch.testing.assert_close(out[:, 0], net.forward_sequence(nxt)[:, 0], atol=TOL, rtol=0)
        assert list(ctx2.length) == [1, 1]
        bump_cache_epoch(other)
        _, c3 = other.extend(empty, toks, limit=7)
        bump_cache_epoch(other)
        assert c3.tag != weights_tag(other)


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_traced_search_step_equals_the_two_eager_extends_across_batch_sizes_and_weight_loads(positional):
    """``cached_step`` (the search's step when every row appends to its cached keys without sliding) through
    ``traced_method`` gives, bit for bit, what the two eager :meth:`extend` calls and the heads give: at a
    batch size other than the traced one and after weights are loaded in place."""
    from muzero_tune.models.traced import _TRACES, traced_method

    net, other = _net(positional, seed=0), _net(positional, seed=1)
    g = torch.Generator().manual_seed(4)

    def check(lengths):
        bsz = len(lengths)
        empty = TokenContext.empty(bsz, max_tokens=11, embed_dim=32, device=torch.device("cpu"),
                                   dtype=torch.float32)  # fmt: skip
        toks = torch.randn(bsz, max(lengths), 32, generator=g)
        _, ctx = net.extend(empty, toks, np.array(lengths), limit=9)
        action = torch.randint(0, 3, (bsz,), generator=g)
        got = traced_method(net, "cached_step", ctx.tokens, ctx.keys, ctx.values,
                            torch.as_tensor(ctx.length), action)  # fmt: skip
        h1, ctx1 = net.extend(ctx, net.embed_action(action)[:, None], limit=11)
        act = net.action_heads(h1[:, 0])
        h2, ctx2 = net.extend(ctx1, act.next_latent[:, None], limit=11)
        obs = net.obs_heads(h2[:, 0])
        want = (act.next_latent, act.reward_logits, obs.value_logits, obs.policy_logits,
                ctx2.tokens, ctx2.keys, ctx2.values)  # fmt: skip
        assert list(ctx2.length) == [n + 2 for n in lengths]
        for got_t, want_t in zip(got, want, strict=True):
            assert torch.equal(got_t, want_t)

    with torch.no_grad():
        check([3])  # traced at B = 1 (where a trace could bake in the broadcasts of one row)
        assert _TRACES[net][("cached_step", None)][1] is not None
        check([1, 3, 5, 9])  # 9 + 2 = 11 tokens: the last row fills its window
        check([2, 7, 4])
        net.load_state_dict(other.state_dict())
        check([6, 1, 8, 3, 5])


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_traced_extends_equal_the_eager_ones_bit_for_bit(positional):
    """Every path of :meth:`extend` (root windows of several tokens, cached appends, windows that slide and
    are recomputed, rows with and without cached keys in one batch) runs traced where autograd is off and
    gives the eager outputs and contexts bit for bit, the first trace made at batch size 1."""
    from muzero_tune.models.traced import _TRACES, make_eager

    net = _net(positional, max_tokens=9)
    eager = make_eager(copy.deepcopy(net))
    g = torch.Generator().manual_seed(5)
    rng = np.random.default_rng(5)

    def same(a: TokenContext, b: TokenContext) -> None:
        assert np.array_equal(a.length, b.length) and np.array_equal(a.kv_valid, b.kv_valid)
        for x, y in ((a.tokens, b.tokens), (a.keys, b.keys), (a.values, b.values)):
            assert (x is None) == (y is None) and (x is None or torch.equal(x, y))

    with torch.no_grad():
        for bsz in (1, 4, 3):
            lens = rng.integers(1, 8, size=bsz)
            toks = torch.randn(bsz, int(lens.max()), 32, generator=g)
            ctxs = []
            for m in (net, eager):
                empty = TokenContext.empty(bsz, max_tokens=9, embed_dim=32, device=torch.device("cpu"),
                                           dtype=torch.float32)  # fmt: skip
                out, ctx = m.extend(empty, toks, lens, limit=7)
                ctxs.append((out, ctx))
            assert torch.equal(ctxs[0][0], ctxs[1][0])
            same(ctxs[0][1], ctxs[1][1])
            for _ in range(6):  # appends of 1-2 tokens, some rows' windows sliding
                if rng.random() < 0.3:  # some rows lose their cached keys
                    lost = np.flatnonzero(rng.random(bsz) < 0.5)
                    ctxs = [(o, c.without_cache(lost)) for o, c in ctxs]
                new = torch.randn(bsz, 2, 32, generator=g)
                new_len = rng.integers(1, 3, size=bsz)
                ctxs = [m.extend(c, new, new_len, limit=9) for m, (_, c) in zip((net, eager), ctxs)]
                real = torch.arange(2)[None, :] < torch.as_tensor(new_len)[:, None]  # other slots: padding
                assert torch.equal(ctxs[0][0][real], ctxs[1][0][real])
                same(ctxs[0][1], ctxs[1][1])
    names = {slot[0] for slot in _TRACES[net]}
    assert {"window_step", "window_step_past", "attend_cached"} <= names
    assert eager not in _TRACES
