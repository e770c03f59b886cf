"""The search's steps as numba kernels (muzero_tune.models.host) against the eager and traced calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from muzero_tune.config import make_config
from muzero_tune.models import MLPMuZeroNet, logits_to_scalar
from muzero_tune.models.host import (
    MAX_ROWS,
    host_kernel_kind,
    host_recurrent_outputs,
    host_search_step,
    host_value_prefix_step,
)
from muzero_tune.pipeline.core import make_policy

# float32 rounding of sums taken in another order: the outputs are O(1)..O(10) at these weights
ATOL = 2e-5


def _net(seed: int, *, layers: int = 1, actions: int = 3) -> MLPMuZeroNet:
    torch.manual_seed(seed)
    net = MLPMuZeroNet(
        obs_dim=4, num_actions=actions, latent_dim=16, hidden_dim=32, num_hidden_layers=layers,
        value_support_size=10, reward_support_size=5, projection_dim=8,
    )  # fmt: skip
    for p in net.parameters():  # the zero-initialised heads would hide a wrong head
        nn.init.normal_(p, std=0.3)
    return net.eval()


def _twins(preset: str):
    """(policy, env spec, a network of ``preset`` whose search steps run on the host kernel, a second one on
    the traced call), same weights."""
    policy, spec = make_policy(make_config(preset, overrides={"logging.quiet": True}))
    host_net, traced_net = policy.build_model().eval(), policy.build_model().eval()
    traced_net.host_recurrent = False
    traced_net.load_state_dict(host_net.state_dict())
    return policy, spec, host_net, traced_net


def _new_weights(host_net: nn.Module, traced_net: nn.Module, std: float) -> None:
    """Random weights in ``host_net`` (the zero-initialised heads would hide a wrong head), loaded in place
    into ``traced_net``."""
    for p in host_net.parameters():
        nn.init.normal_(p, std=std)
    traced_net.load_state_dict(host_net.state_dict())


def _assert_decoded_close(got, want) -> None:
    """Decoded float32 search outputs (rewards or Q, values, logits) equal to float32 rounding."""
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4)  # decoded values are O(100)


def _check(net: MLPMuZeroNet, rows: int) -> None:
    latent = torch.rand(rows, 16)
    action = torch.randint(0, net.num_actions, (rows,))
    with torch.no_grad():
        want = net.recurrent_inference(latent, action)
        got = host_recurrent_outputs(net, latent, action)
    assert got is not None
    wants = (want.latent, want.reward_logits, want.value_logits, want.policy_logits)
    for g, w in zip(got, wants, strict=True):
        assert g.shape == w.shape and g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=0.0, atol=ATOL)


@pytest.mark.parametrize("layers", [0, 1, 2])
def test_host_call_equals_eager_across_depths_batch_sizes_and_weight_loads(layers):
    """The kernel gives the eager outputs to float32 rounding for trunks of 0-2 layers at 1..MAX_ROWS rows,
    sees weights loaded in place (a collector's weight sync) and parameters replaced by new tensors."""
    net = _net(0, layers=layers)
    for rows in (1, 5, 8, MAX_ROWS):
        _check(net, rows)
    net.load_state_dict(_net(1, layers=layers).state_dict())  # in place
    _check(net, 8)
    net.load_state_dict(_net(2, layers=layers).state_dict(), assign=True)  # new tensors
    _check(net, 8)
    with torch.no_grad():
        net.pred_policy.weight.mul_(-1.0)  # one in-place change, not through load_state_dict
    _check(net, 3)


def test_host_step_decodes_as_the_traced_call():
    """The policy's search step with the kernel (mcts.host_kernel) returns the traced step's next latent,
    rewards, values and policy logits to float32 rounding, on the CartPole preset's network."""
    policy, _, host_net, traced_net = _twins("cartpole_muzero")
    _new_weights(host_net, traced_net, 0.1)
    latent = torch.rand(8, *host_net.latent_shape)
    actions = np.arange(8) % 2
    with torch.no_grad():
        assert host_search_step(host_net, latent, actions, reward_support_size=5, value_support_size=50)
        got = policy.recurrent_fn(host_net)(latent, actions)
        want = policy.recurrent_fn(traced_net)(latent, actions)
        values = host_net.recurrent_inference(latent, torch.as_tensor(actions)).value_logits
    assert isinstance(got[0], torch.Tensor) and all(isinstance(x, np.ndarray) for x in got[1:])
    np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=0.0, atol=ATOL)
    _assert_decoded_close(got[1:], want[1:])
    assert np.abs(want[2]).min() > 0.1  # the decoded values are not zero: the check has teeth
    decoded = logits_to_scalar(values, support_size=host_net.value_support_size).numpy()
    np.testing.assert_allclose(got[2], decoded, rtol=1e-5, atol=1e-4)


def test_collect_step_with_the_host_kernel_matches_the_traced_one():
    """A whole CartPole collect step (8 envs, 25 simulations, root noise) with the kernel picks the traced
    step's actions from the same visit counts; the root values agree to float32 rounding."""
    policy, spec, host_net, traced_net = _twins("cartpole_muzero")
    _new_weights(host_net, traced_net, 0.1)
    with torch.no_grad():  # the kernel runs this network's search calls
        assert host_search_step(host_net, torch.rand(8, *host_net.latent_shape), np.zeros(8),
                                reward_support_size=5, value_support_size=50)  # fmt: skip
    obs = np.random.default_rng(0).normal(size=(8, *spec.obs_shape)).astype(np.float32)
    mask = np.ones((8, spec.num_actions), dtype=bool)
    outs = [
        policy.act(net, obs, mask, explore=True, temperature=1.0, rng=np.random.default_rng(1))
        for net in (host_net, traced_net)
    ]
    np.testing.assert_array_equal(outs[0].actions, outs[1].actions)
    np.testing.assert_array_equal(outs[0].step_stats["child_visits"], outs[1].step_stats["child_visits"])
    np.testing.assert_allclose(outs[0].root_value, outs[1].root_value, rtol=1e-5, atol=1e-4)


def test_host_call_declines_what_it_does_not_compute():
    """None (the caller's traced or eager call runs) under autograd, under autocast, over MAX_ROWS rows, in
    float64, with the kernel switched off, and for networks whose dynamics or heads differ."""
    from muzero_tune.models.efficientzero_net import MLPEfficientZeroNet
    from muzero_tune.models.factored_net import MLPFactoredMuZeroNet
    from muzero_tune.models.sampled_net import MLPGaussianMuZeroNet

    net = _net(0)
    latent, action = torch.rand(4, 16), torch.randint(0, 3, (4,))
    assert host_recurrent_outputs(net, latent, action) is None  # autograd on
    with torch.no_grad():
        assert host_recurrent_outputs(net, latent, action) is not None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert host_recurrent_outputs(net, latent, action) is None
        big = torch.rand(MAX_ROWS + 1, 16)
        assert host_recurrent_outputs(net, big, torch.zeros(MAX_ROWS + 1, dtype=torch.long)) is None
        assert host_search_step(net, big, np.zeros(MAX_ROWS + 1), reward_support_size=5,
                                value_support_size=10) is None  # fmt: skip
        wide = _net(0).double()
        assert host_recurrent_outputs(wide, latent.double(), action) is None
        off = _net(0)
        off.host_recurrent = False
        assert host_recurrent_outputs(off, latent, action) is None
        mlp = dict(obs_dim=4, latent_dim=16, hidden_dim=32, value_support_size=10, reward_support_size=5)
        for other in (
            MLPGaussianMuZeroNet(action_dim=2, **mlp),
            MLPFactoredMuZeroNet(nvec=(3, 2), **mlp),
            MLPEfficientZeroNet(num_actions=3, **mlp),
        ):
            assert host_recurrent_outputs(other.eval(), latent, action) is None
    kinds = [host_kernel_kind(m) for m in (net, off, wide, MLPEfficientZeroNet(num_actions=3, **mlp),
                                           MLPGaussianMuZeroNet(action_dim=2, **mlp))]  # fmt: skip
    assert kinds == ["reward", None, None, "value_prefix", None]


def test_host_call_rejects_an_action_outside_the_action_space_or_batch():
    net = _net(0)
    with torch.no_grad(), pytest.raises(ValueError, match="num_actions"):
        host_recurrent_outputs(net, torch.rand(2, 16), torch.tensor([0, 3]))
    with torch.no_grad(), pytest.raises(ValueError, match="action batch 1 does not match latent batch 2"):
        host_search_step(net, torch.rand(2, 16), np.zeros(1), reward_support_size=5, value_support_size=10)


@pytest.mark.parametrize("preset", ["cartpole_efficientzero", "lunarlander_efficientzero"])
def test_value_prefix_step_equals_the_traced_step_across_horizons_and_weight_loads(preset):
    """EfficientZero's search step on the kernel (packed latent, LSTM state, depth and prefix) gives the
    traced step's children, rewards, values and policy logits to float32 rounding, for parents that start
    a horizon (zero LSTM state, the whole prefix as reward) and parents inside one, before and after an
    in-place weight load."""
    from muzero_tune.policies.efficientzero import pack_search_state

    policy, spec, host_net, traced_net = _twins(preset)
    rows, hidden = 12, host_net.lstm_hidden_size
    torch.manual_seed(0)
    state = (torch.randn(rows, hidden) * 0.5, torch.randn(rows, hidden) * 0.5)
    depth = torch.arange(rows, dtype=torch.float32)  # every residue of the horizon, the root's 0 included
    packed = pack_search_state(torch.rand(rows, *host_net.latent_shape), state, depth, torch.randn(rows) * 3)
    actions = np.arange(rows) % spec.num_actions
    for seed in (1, 2):
        torch.manual_seed(seed)
        _new_weights(host_net, traced_net, 0.2)
        with torch.no_grad():
            assert host_value_prefix_step(host_net, packed, actions, horizon=policy.horizon,
                                          reward_support_size=host_net.reward_support_size,
                                          value_support_size=host_net.value_support_size)  # fmt: skip
            got = policy.recurrent_fn(host_net)(packed, actions)
            want = policy.recurrent_fn(traced_net)(packed, actions)
        np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=1e-5, atol=ATOL)
        np.testing.assert_array_equal(got[0][:, -2].numpy(), depth.numpy() + 1)
        _assert_decoded_close(got[1:], want[1:])
        assert np.abs(want[1]).min() > 1e-3  # rewards not zero: the horizon logic is exercised


def test_stochastic_steps_equal_the_traced_steps_across_weight_loads():
    """Stochastic MuZero's afterstate step (afterstate, decoded Q, chance logits) and chance step (latent,
    reward, value, policy logits) on the kernels give the traced steps' results to float32 rounding, before
    and after an in-place weight load; every chance code and action is exercised."""
    policy, spec, host_net, traced_net = _twins("cartpole_stochastic_muzero")
    assert host_kernel_kind(host_net) == "chance" and host_kernel_kind(traced_net) is None
    rows = 12
    latent = torch.rand(rows, *host_net.latent_shape)
    actions = np.arange(rows) % spec.num_actions
    codes = np.arange(rows) % host_net.chance_space_size
    for seed in (1, 2):
        torch.manual_seed(seed)
        _new_weights(host_net, traced_net, 0.2)
        with torch.no_grad():
            got, want = policy.search_fns(host_net), policy.search_fns(traced_net)
            for name, index in (("afterstate_fn", actions), ("recurrent_fn", codes)):
                g, w = got[name](latent, index), want[name](latent, index)
                np.testing.assert_allclose(g[0].numpy(), w[0].numpy(), rtol=0.0, atol=ATOL)
                _assert_decoded_close(g[1:], w[1:])
                assert np.abs(w[1]).min() > 1e-3  # decoded Q / rewards not zero: the heads are exercised
