"""Tests for the MuZero networks (muzero_tune.models.muzero_net)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from muzero_tune.models import (
    ConvMuZeroNet,
    InitialOutput,
    MLPMuZeroNet,
    MuZeroNetwork,
    RecurrentOutput,
    build_network,
    logits_to_scalar,
    normalize_latent,
)

B = 4
A = 3
SV = 20
SR = 10


def _mlp() -> MLPMuZeroNet:
    torch.manual_seed(0)
    return MLPMuZeroNet(
        obs_dim=5,
        num_actions=A,
        latent_dim=16,
        hidden_dim=32,
        value_support_size=SV,
        reward_support_size=SR,
        projection_dim=24,
    )


def _conv(size: int = 64, **kwargs) -> ConvMuZeroNet:
    torch.manual_seed(0)
    defaults = dict(
        obs_shape=(6, size, size),
        num_actions=A,
        num_channels=8,
        num_res_blocks=1,
        value_support_size=SV,
        reward_support_size=SR,
        reduced_channels=4,
        fc_hidden=16,
        projection_dim=32,
    )
    defaults.update(kwargs)
    return ConvMuZeroNet(**defaults)


def _obs(net: MuZeroNetwork, batch: int = B, *, uint8: bool = False) -> torch.Tensor:
    if isinstance(net, MLPMuZeroNet):
        return torch.randn(batch, net.obs_dim)
    if uint8:
        return torch.randint(0, 256, (batch, *net.obs_shape), dtype=torch.uint8)
    return torch.rand(batch, *net.obs_shape)


NETS = {"mlp": _mlp, "conv": _conv}


@pytest.mark.parametrize("kind", list(NETS))
def test_output_shapes_and_types(kind):
    net = NETS[kind]()
    assert net.num_actions == A and net.value_support_size == SV and net.reward_support_size == SR
    init = net.initial_inference(_obs(net))
    assert isinstance(init, InitialOutput)
    assert init.latent.shape == (B, *net.latent_shape)
    assert init.value_logits.shape == (B, 2 * SV + 1)
    assert init.policy_logits.shape == (B, A)

    rec = net.recurrent_inference(init.latent, torch.tensor([0, 1, 2, 1]))
    assert isinstance(rec, RecurrentOutput)
    assert rec.latent.shape == (B, *net.latent_shape)
    assert rec.reward_logits.shape == (B, 2 * SR + 1)
    assert rec.value_logits.shape == (B, 2 * SV + 1)
    assert rec.policy_logits.shape == (B, A)

    assert net.represent(_obs(net)).shape == (B, *net.latent_shape)
    assert net.project(init.latent, with_prediction_head=True).shape == (B, net.projection_dim)
    assert net.project(init.latent, with_prediction_head=False).shape == (B, net.projection_dim)

    with pytest.raises(dataclasses.FrozenInstanceError):
        init.latent = init.latent  # type: ignore[misc]


@pytest.mark.parametrize("kind", list(NETS))
def test_latents_are_min_max_normalised(kind):
    net = NETS[kind]()
    latent = net.initial_inference(_obs(net) * 10.0).latent
    for _ in range(3):
        flat = latent.flatten(1)
        assert flat.min() >= 0.0 and flat.max() <= 1.0
        # Each sample spans the full [0, 1] range (non-degenerate latent).
        torch.testing.assert_close(flat.min(1).values, torch.zeros(B))
        torch.testing.assert_close(flat.max(1).values, torch.ones(B), atol=1e-4, rtol=0)
        latent = net.recurrent_inference(latent, torch.randint(0, A, (B,))).latent


def test_normalize_latent_constant_input_is_finite():
    out = normalize_latent(torch.full((2, 3, 2, 2), 7.0))
    assert torch.isfinite(out).all() and (out == 0).all()


def test_conv_accepts_uint8_and_scales_like_float():
    net = _conv().eval()
    obs = _obs(net, uint8=True)
    with torch.no_grad():
        a = net.initial_inference(obs)
        b = net.initial_inference(obs.float() / 255.0)
    torch.testing.assert_close(a.latent, b.latent)
    torch.testing.assert_close(a.policy_logits, b.policy_logits)


def test_mlp_flattens_and_casts_obs():
    net = _mlp().eval()
    obs = torch.randn(B, 5, dtype=torch.float64)
    with torch.no_grad():
        out = net.initial_inference(obs)
        ref = net.initial_inference(obs.float().view(B, 1, 5))
    assert out.latent.dtype == torch.float32
    torch.testing.assert_close(out.latent, ref.latent)


@pytest.mark.parametrize("size, expected", [(64, 4), (96, 6)])
def test_conv_downsampling_resolution(size, expected):
    net = _conv(size)
    assert net.latent_shape == (8, expected, expected)
    latent = net.initial_inference(_obs(net, 2, uint8=True)).latent
    assert latent.shape == (2, 8, expected, expected)


def test_conv_without_downsampling_keeps_resolution():
    net = _conv(10, downsample=False)
    assert net.latent_shape == (8, 10, 10)
    out = net.recurrent_inference(net.represent(_obs(net, 2)), torch.tensor([0, 2]))
    assert out.latent.shape == (2, 8, 10, 10)


@pytest.mark.parametrize("kind", list(NETS))
def test_gradients_reach_every_parameter(kind):
    net = NETS[kind]()
    # The value/reward output layers start at zero, which blocks gradient to the layers behind
    # them at step 0 by design; give every all-zero tensor small values to test connectivity.
    with torch.no_grad():
        for p in net.parameters():
            if p.abs().sum() == 0:
                p.normal_(std=0.05)
    obs, next_obs = _obs(net), _obs(net)
    init = net.initial_inference(obs)
    rec = net.recurrent_inference(init.latent, torch.randint(0, A, (B,)))
    online = net.project(rec.latent, with_prediction_head=True)
    target = net.project(net.represent(next_obs), with_prediction_head=False)
    loss = (
        init.value_logits.logsumexp(-1).sum()
        + init.policy_logits.logsumexp(-1).sum()
        + rec.reward_logits.logsumexp(-1).sum()
        + rec.value_logits.logsumexp(-1).sum()
        + rec.policy_logits.logsumexp(-1).sum()
        + (online * torch.randn_like(online)).sum()
        + (target * torch.randn_like(target)).sum()
    )
    loss.backward()
    names = [n for n, p in net.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert names == []
    assert all(torch.isfinite(p.grad).all() for p in net.parameters())


@pytest.mark.parametrize("kind", list(NETS))
def test_fresh_value_and_reward_decode_to_zero(kind):
    net = NETS[kind]()
    init = net.initial_inference(_obs(net))
    rec = net.recurrent_inference(init.latent, torch.randint(0, A, (B,)))
    assert logits_to_scalar(init.value_logits, support_size=SV).abs().max() < 1e-5
    assert logits_to_scalar(rec.value_logits, support_size=SV).abs().max() < 1e-5
    assert logits_to_scalar(rec.reward_logits, support_size=SR).abs().max() < 1e-5
    # The policy head is not zeroed: priors must still depend on the state.
    assert init.policy_logits.std() > 0


def test_action_changes_dynamics():
    for net in (_mlp().eval(), _conv().eval()):
        with torch.no_grad():
            latent = net.represent(_obs(net, 1)).expand(A, *net.latent_shape)
            out = net.recurrent_inference(latent, torch.arange(A))
        assert not torch.allclose(out.latent[0], out.latent[1])


def test_action_batch_mismatch_raises():
    net = _mlp()
    with pytest.raises(ValueError, match="action batch"):
        net.recurrent_inference(torch.rand(B, 16), torch.zeros(B + 1, dtype=torch.long))


def test_build_network_kinds():
    mlp = build_network(kind="mlp", obs_shape=(2, 3), num_actions=2, latent_dim=8, value_support_size=5)
    assert isinstance(mlp, MLPMuZeroNet) and mlp.obs_dim == 6 and mlp.latent_shape == (8,)
    conv = build_network(kind="conv", obs_shape=(3, 32, 32), num_actions=4, num_channels=4)
    assert isinstance(conv, ConvMuZeroNet) and conv.latent_shape == (4, 2, 2)
    assert isinstance(mlp, nn.Module) and isinstance(conv, MuZeroNetwork)


def test_build_network_unknown_kind_message():
    with pytest.raises(ValueError) as info:
        build_network(kind="transformer", obs_shape=(4,), num_actions=2)
    msg = str(info.value)
    assert "model.kind" in msg and "'transformer'" in msg and "mlp" in msg and "conv" in msg


def test_conv_rejects_bad_obs_shape():
    with pytest.raises(ValueError, match="obs_shape"):
        ConvMuZeroNet(obs_shape=(64, 64), num_actions=2)


@pytest.mark.parametrize("kind", ["mlp", "mlp_continuous", "conv", "conv_continuous", "conv_factored",
                                  "conv_channels_last"])
def test_traced_recurrent_call_equals_eager_across_batch_sizes_and_weight_loads(kind):
    """The search's traced recurrent call (models/traced.py) gives the eager outputs bit for bit at batch
    sizes other than the one it was traced at (1: a broadcast baked into the trace would show), sees weights
    loaded in place afterwards, and is not used with autograd; for the MLP and the conv networks (whose
    dynamics' action planes take their batch size from the latent), discrete, continuous and factored."""
    from muzero_tune.models.factored_net import ConvFactoredMuZeroNet
    from muzero_tune.models.sampled_net import ConvGaussianMuZeroNet, MLPGaussianMuZeroNet
    from muzero_tune.models.traced import _TRACES, recurrent_outputs

    continuous = kind.endswith("continuous")

    def make(seed):
        torch.manual_seed(seed)
        sup = dict(value_support_size=5, reward_support_size=3)
        mlp = dict(obs_dim=4, latent_dim=8, hidden_dim=16, **sup)
        conv = dict(obs_shape=(3, 16, 16), num_channels=4, projection_dim=8, **sup)
        net = {
            "mlp": lambda: MLPMuZeroNet(num_actions=3, **mlp),
            "mlp_continuous": lambda: MLPGaussianMuZeroNet(action_dim=2, **mlp),
            "conv": lambda: ConvMuZeroNet(num_actions=3, **conv),
            "conv_continuous": lambda: ConvGaussianMuZeroNet(action_dim=2, **conv),
            "conv_factored": lambda: ConvFactoredMuZeroNet(nvec=(3, 2), **conv),
            "conv_channels_last": lambda: ConvMuZeroNet(num_actions=3, **conv).to(
                memory_format=torch.channels_last),
        }[kind]()
        for p in net.parameters():  # the zero-initialised heads would hide a stale trace
            nn.init.normal_(p, std=0.3)
        return net.eval()

    net, other = make(0), make(1)

    def action(b):
        if continuous:
            return torch.rand(b, 2) * 2 - 1
        if kind == "conv_factored":
            return torch.stack([torch.randint(0, 3, (b,)), torch.randint(0, 2, (b,))], dim=1)
        return torch.randint(0, 3, (b,))

    def latent(b):
        return torch.rand(b, *net.latent_shape)

    def check(b_latent, b_action):
        out = net.recurrent_inference(b_latent, b_action)
        want = out.latent, out.reward_logits, out.value_logits, out.policy_logits
        for got, w in zip(recurrent_outputs(net, b_latent, b_action), want, strict=True):
            torch.testing.assert_close(got, w, rtol=0.0, atol=0.0)

    with torch.no_grad():
        recurrent_outputs(net, latent(1), action(1))  # traced at B = 1
        assert _TRACES.get(net) is not None and _TRACES[net][("recurrent", None)][1] is not None
        for b in (3, 8, 1):
            check(latent(b), action(b))
        net.load_state_dict(other.state_dict())  # in place, as a collector's weight sync
        lat, act = latent(5), action(5)
        check(lat, act)
        # parameters replaced by new tensors (not in place): the trace is made again with them
        net.load_state_dict(make(2).state_dict(), assign=True)
        check(lat, act)
    lat = latent(4).requires_grad_(True)
    assert recurrent_outputs(net, lat, action(4))[0].requires_grad  # eager under autograd


@pytest.mark.parametrize("kind", ["mlp", "mlp_continuous", "conv"])
def test_traced_value_prefix_call_equals_eager_with_its_lstm_state_across_batch_sizes_and_weight_loads(kind):
    """EfficientZero's search call with its LSTM state (models/traced.py ``recurrent_state_outputs``) is
    traced, gives the eager outputs and next (h, c) bit for bit at batch sizes other than the traced one
    and from non-zero states, and sees weights loaded in place; MLP (discrete, continuous) and conv."""
    from muzero_tune.models.efficientzero_net import ConvEfficientZeroNet, MLPEfficientZeroNet
    from muzero_tune.models.sampled_net import MLPGaussianEfficientZeroNet
    from muzero_tune.models.traced import _TRACES, recurrent_state_outputs

    continuous = kind == "mlp_continuous"

    def make(seed):
        torch.manual_seed(seed)
        sup = dict(value_support_size=5, reward_support_size=3, lstm_hidden_size=6)
        kw = dict(obs_dim=4, latent_dim=8, hidden_dim=16, **sup)
        if kind == "conv":
            net = ConvEfficientZeroNet(obs_shape=(3, 16, 16), num_actions=3, num_channels=4, projection_dim=8,
                                       **sup)  # fmt: skip
        elif continuous:
            net = MLPGaussianEfficientZeroNet(action_dim=2, **kw)
        else:
            net = MLPEfficientZeroNet(num_actions=3, **kw)
        for p in net.parameters():  # the zero-initialised heads would hide a stale trace
            nn.init.normal_(p, std=0.3)
        return net.eval()

    net, other = make(0), make(1)

    def inputs(b):
        act = torch.rand(b, 2) * 2 - 1 if continuous else torch.randint(0, 3, (b,))
        return torch.rand(b, *net.latent_shape), act, (torch.randn(b, 6), torch.randn(b, 6))

    def check(lat, act, state):
        got = recurrent_state_outputs(net, lat, act, state)
        out = net.recurrent_inference(lat, act, state)
        want = (out.latent, out.reward_logits, out.value_logits, out.policy_logits, out.lstm_state)
        for g, w in zip((*got[:4], *got[4]), (*want[:4], *want[4]), strict=True):
            torch.testing.assert_close(g, w, rtol=0.0, atol=0.0)
        assert not torch.equal(got[4][0], state[0])  # the state moved

    with torch.no_grad():
        recurrent_state_outputs(net, *inputs(1))  # traced at B = 1
        assert _TRACES[net][("recurrent_state", None)][1] is not None
        for b in (3, 8):
            check(*inputs(b))
        net.load_state_dict(other.state_dict())  # in place, as a collector's weight sync
        check(*inputs(5))


@pytest.mark.parametrize("base_kind", ["mlp", "conv"])
def test_traced_recurrent_call_of_the_history_network_equals_eager_and_follows_its_base(base_kind):
    """The recurrent-history network's search call is traced where its base network's is (MLP and conv),
    gives the eager outputs bit for bit at another batch size and after an in-place weight load."""
    from muzero_tune.models.rnn_net import RNNMuZeroNet
    from muzero_tune.models.traced import _TRACES, recurrent_outputs

    def make(seed):
        torch.manual_seed(seed)
        sup = dict(value_support_size=5, reward_support_size=3)
        if base_kind == "mlp":
            base = MLPMuZeroNet(obs_dim=4, num_actions=3, latent_dim=8, hidden_dim=16, **sup)
        else:
            base = ConvMuZeroNet(obs_shape=(3, 16, 16), num_actions=3, num_channels=4, projection_dim=8,
                                 **sup)
        net = RNNMuZeroNet(base, history_size=6)
        for p in net.parameters():
            nn.init.normal_(p, std=0.3)
        return net.eval()

    net, other = make(0), make(1)

    def check(b):
        lat, act = torch.rand(b, *net.latent_shape), torch.randint(0, 3, (b,))
        out = net.recurrent_inference(lat, act)
        want_all = (out.latent, out.reward_logits, out.value_logits, out.policy_logits)
        for got, want in zip(recurrent_outputs(net, lat, act), want_all, strict=True):
            torch.testing.assert_close(got, want, rtol=0.0, atol=0.0)

    with torch.no_grad():
        check(1)  # traced at B = 1
        assert net.traceable_recurrent and _TRACES[net][("recurrent", None)][1] is not None
        check(8)
        check(3)
        net.load_state_dict(other.state_dict())
        check(5)


def test_traced_stochastic_steps_equal_eager_across_batch_sizes_and_weight_loads():
    """Stochastic MuZero's two search steps (afterstate, chance) through ``traced_method`` are traced, give
    the eager outputs at a batch size other than the traced one and see weights loaded in place."""
    from muzero_tune.models.stochastic_net import MLPStochasticMuZeroNet
    from muzero_tune.models.traced import _TRACES, traced_method

    def make(seed):
        torch.manual_seed(seed)
        net = MLPStochasticMuZeroNet(obs_dim=4, num_actions=3, chance_space_size=4, latent_dim=8,
                                     hidden_dim=16, value_support_size=5, reward_support_size=3)
        for p in net.parameters():
            nn.init.normal_(p, std=0.3)
        return net.eval()

    net, other = make(0), make(1)

    def check(b):
        lat, act, code = torch.rand(b, 8), torch.randint(0, 3, (b,)), torch.randint(0, 4, (b,))
        for name, args in (("afterstate_inference", (lat, act)), ("chance_inference", (lat, code))):
            got, want = traced_method(net, name, *args), getattr(net, name)(*args)
            assert len(got) == len(want)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)

    with torch.no_grad():
        check(8)  # traced at B = 8
        assert all(_TRACES[net][(name, None)][1] is not None
                   for name in ("afterstate_inference", "chance_inference"))
        check(3)
        net.load_state_dict(other.state_dict())
        check(5)
    lat = torch.rand(2, 8, requires_grad=True)
    assert traced_method(net, "chance_inference", lat, torch.tensor([0, 1]))[0].requires_grad


@pytest.mark.parametrize("kind", ["mlp", "conv"])
def test_traced_initial_value_equals_eager_across_batch_sizes_weight_loads_and_precisions(kind):
    """The bootstrap's traced value forward (models/traced.py) gives the eager value logits at batch sizes
    other than the traced one, sees weights loaded in place (the target network's update), keeps one trace
    per autocast precision (each equal to eager under that precision), and is not used with autograd."""
    from muzero_tune.models.traced import _TRACES, initial_value_logits

    def make(seed):
        torch.manual_seed(seed)
        if kind == "mlp":
            net = MLPMuZeroNet(obs_dim=4, num_actions=3, latent_dim=8, hidden_dim=16, value_support_size=5,
                               reward_support_size=3)  # fmt: skip
        else:
            net = ConvMuZeroNet(obs_shape=(2, 16, 16), num_actions=3, num_channels=8, value_support_size=5,
                                reward_support_size=3, projection_dim=8)  # fmt: skip
        for p in net.parameters():  # the zero-initialised heads would hide a stale trace
            nn.init.normal_(p, std=0.3)
        return net.eval()

    net, other = make(0), make(1)
    shape = (4,) if kind == "mlp" else (2, 16, 16)

    def obs(b):
        return torch.rand(b, *shape)

    def eager(o):
        return net.initial_inference(o).value_logits

    with torch.no_grad():
        initial_value_logits(net, obs(8))  # traced at B = 8
        assert _TRACES[net][("initial", None)][1] is not None
        for b in (3, 8, 21):
            o = obs(b)
            torch.testing.assert_close(initial_value_logits(net, o), eager(o), rtol=0, atol=0)
        net.load_state_dict(other.state_dict())  # in place, as the target network's hard update
        o = obs(5)
        torch.testing.assert_close(initial_value_logits(net, o), eager(o), rtol=0, atol=0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, want = initial_value_logits(net, o), eager(o)
        assert got.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert {("initial", None), ("initial", torch.bfloat16)} <= set(_TRACES[net])
        torch.testing.assert_close(initial_value_logits(net, o), eager(o), rtol=0, atol=0)  # fp32 trace kept
    assert initial_value_logits(net, obs(2)).requires_grad  # eager under autograd


def test_set_training_switches_every_module_and_calls_an_overriding_train():
    """policies.base.set_training (the acting context's mode switch) leaves every module in the asked mode,
    as Module.train does, so batch norm uses its running statistics when acting; a model with a module that
    overrides ``train`` gets that override called."""
    import copy

    from muzero_tune.policies.base import eval_mode, set_training

    net = _conv().train()
    obs = _obs(net)
    reference = copy.deepcopy(net).eval()
    set_training(net, False)
    assert not any(m.training for m in net.modules())
    with torch.no_grad():
        acting = net.represent(obs)
        torch.testing.assert_close(acting, reference.represent(obs), rtol=0.0, atol=0.0)
        set_training(net, True)
        assert all(m.training for m in net.modules())
        assert not torch.allclose(net.represent(obs), acting)  # batch statistics again
    with eval_mode(net):
        assert not any(m.training for m in net.modules())
    assert all(m.training for m in net.modules())

    calls = []

    class Custom(nn.Module):
        def train(self, mode: bool = True):
            calls.append(mode)
            return super().train(mode)

    net = nn.Sequential(nn.Linear(2, 2), Custom())
    set_training(net, False)
    assert calls == [False] and not any(m.training for m in net.modules())
