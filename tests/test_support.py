"""Tests for the categorical support transforms (muzero_tune.models.support)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from muzero_tune.models.support import (
    Support,
    inverse_scalar_transform,
    logits_to_scalar,
    scalar_to_target,
    scalar_to_two_hot,
    scalar_transform,
)


def _decode_two_hot(probs: torch.Tensor, support_size: int) -> torch.Tensor:
    bins = torch.arange(-support_size, support_size + 1, dtype=probs.dtype)
    return inverse_scalar_transform((probs * bins).sum(-1))


def test_transform_round_trip_wide_range():
    x = torch.linspace(-1e4, 1e4, 100_001, dtype=torch.float64)
    x = torch.cat([x, torch.tensor([0.0, 1e-8, -1e-8, 0.5, -0.5, 1.0, -1.0], dtype=torch.float64)])
    back = inverse_scalar_transform(scalar_transform(x))
    torch.testing.assert_close(back, x, rtol=1e-10, atol=1e-10)

    x32 = x.float()
    back32 = inverse_scalar_transform(scalar_transform(x32))
    assert ((back32 - x32).abs() / (1.0 + x32.abs())).max() < 1e-5


def test_transform_known_values_and_shape():
    x = torch.tensor([[0.0, 3.0], [-3.0, 8.0]])
    y = scalar_transform(x, eps=0.0)
    torch.testing.assert_close(y, torch.tensor([[0.0, 1.0], [-1.0, 2.0]]))
    assert y.shape == x.shape
    torch.testing.assert_close(inverse_scalar_transform(y, eps=0.0), x)
    # Integer input is promoted rather than rejected.
    assert scalar_transform(torch.tensor([3])).is_floating_point()


@pytest.mark.parametrize("support_size", [1, 10, 300])
def test_two_hot_properties(support_size):
    y = torch.cat(
        [
            torch.linspace(-support_size, support_size, 1001),
            torch.arange(-support_size, support_size + 1).float(),  # exact bin centres
            torch.tensor([-0.3, 0.3, -0.7 * support_size, support_size - 0.25]),
        ]
    )
    probs = scalar_to_two_hot(y, support_size=support_size)
    assert probs.shape == (y.numel(), 2 * support_size + 1)
    assert (probs >= 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(y.numel()))
    assert ((probs > 0).sum(-1) <= 2).all()
    bins = torch.arange(-support_size, support_size + 1).float()
    torch.testing.assert_close((probs * bins).sum(-1), y, atol=1e-5, rtol=0)


def test_two_hot_integer_bin_is_one_hot_and_negative_split():
    probs = scalar_to_two_hot(torch.tensor([2.0, -2.0, -1.25]), support_size=3)
    expected = torch.zeros(3, 7)
    expected[0, 5] = 1.0  # +2 -> bin index 2 + 3
    expected[1, 1] = 1.0  # -2 -> bin index 1
    expected[2, 1] = 0.25  # -1.25 = 0.25 * (-2) + 0.75 * (-1)
    expected[2, 2] = 0.75
    torch.testing.assert_close(probs, expected)


def test_two_hot_clips_at_range_edges():
    probs = scalar_to_two_hot(torch.tensor([5.0, 100.0, -7.5, 5.0 - 1e-6]), support_size=5)
    assert probs[0, -1] == 1.0 and probs[1, -1] == 1.0
    assert probs[2, 0] == 1.0
    torch.testing.assert_close(probs.sum(-1), torch.ones(4))
    bins = torch.arange(-5, 6).float()
    torch.testing.assert_close((probs * bins).sum(-1), torch.tensor([5.0, 5.0, -5.0, 5.0 - 1e-6]))


def test_two_hot_keeps_leading_dims():
    y = torch.zeros(2, 3, 4)
    assert scalar_to_two_hot(y, support_size=6).shape == (2, 3, 4, 13)
    assert logits_to_scalar(torch.zeros(2, 3, 13), support_size=6).shape == (2, 3)


@pytest.mark.parametrize("support_size", [10, 300])
def test_target_decodes_back_to_scalar(support_size):
    # float64 throughout so the range edge +-h^-1(S) is not pushed past S by rounding.
    hi = float(inverse_scalar_transform(torch.tensor(float(support_size), dtype=torch.float64)))
    x = torch.cat(
        [
            torch.linspace(-hi, hi, 2001, dtype=torch.float64),
            torch.tensor([0.0, 1.0, -1.0, 3.0, -3.0, 0.01, -0.01], dtype=torch.float64),
            inverse_scalar_transform(torch.arange(-support_size, support_size + 1, dtype=torch.float64)),
        ]
    )
    target = scalar_to_target(x, support_size=support_size)
    torch.testing.assert_close(target.sum(-1), torch.ones_like(x))
    decoded = _decode_two_hot(target, support_size)
    torch.testing.assert_close(decoded, x, rtol=1e-7, atol=1e-7)


def test_target_clips_large_scalars():
    support_size = 5
    target = scalar_to_target(torch.tensor([1e6, -1e6]), support_size=support_size)
    assert target[0, -1] == 1.0 and target[1, 0] == 1.0
    edge = inverse_scalar_transform(torch.tensor([5.0, -5.0]))
    torch.testing.assert_close(_decode_two_hot(target, support_size), edge)


@pytest.mark.parametrize("support_size", [10, 300])
def test_logits_to_scalar_recovers_target_scalar(support_size):
    hi = float(inverse_scalar_transform(torch.tensor(float(support_size))))
    x = torch.cat([torch.linspace(-hi * 0.99, hi * 0.99, 501), torch.tensor([0.0, 2.5, -2.5, 42.0])]).double()
    target = scalar_to_target(x, support_size=support_size)
    # log of the two-hot with a large negative number where it is zero.
    logits = torch.where(target > 0, target.clamp_min(1e-300).log(), torch.full_like(target, -1e4))
    decoded = logits_to_scalar(logits, support_size=support_size)
    torch.testing.assert_close(decoded, x, rtol=1e-7, atol=1e-7)


def test_uniform_logits_decode_to_zero():
    assert logits_to_scalar(torch.zeros(4, 601), support_size=300).abs().max() < 1e-4


def test_logits_to_scalar_rejects_wrong_width():
    with pytest.raises(ValueError, match="2 \\* support_size \\+ 1"):
        logits_to_scalar(torch.zeros(3, 10), support_size=5)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_invalid_support_size(bad):
    with pytest.raises(ValueError, match="support_size"):
        scalar_to_two_hot(torch.zeros(2), support_size=bad)


def test_support_dataclass_matches_functions():
    s = Support(size=20)
    assert s.num_bins == 41
    x = torch.tensor([-12.0, 0.0, 3.5, 77.0])
    torch.testing.assert_close(s.to_target(x), scalar_to_target(x, support_size=20))
    torch.testing.assert_close(s.inverse_transform(s.transform(x)), x)
    logits = torch.randn(4, 41)
    torch.testing.assert_close(s.to_scalar(logits), logits_to_scalar(logits, support_size=20))
    torch.testing.assert_close(s.two_hot(s.transform(x)), s.to_target(x))
    with pytest.raises(ValueError):
        Support(size=0)


def test_numba_decode_matches_torch_decode():
    import numpy as np

    from muzero_tune.models import logits_to_scalar, logits_to_scalar_np

    g = torch.Generator().manual_seed(0)
    for s in (5, 50, 300):
        logits = torch.randn(64, 2 * s + 1, generator=g) * 3
        ref = logits_to_scalar(logits.double(), support_size=s).numpy()
        got = logits_to_scalar_np(logits.numpy(), support_size=s)
        assert got.dtype == np.float32 and got.shape == (64,)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("support_size", [1, 5, 50])
def test_two_hot_cross_entropy_equals_dense_target_ce_with_gradient(support_size):
    """The gather form agrees with CE against the dense two-hot target, value and gradient, including
    values past the support's edge (clipped) and exactly on it."""
    from muzero_tune.models.support import two_hot_cross_entropy

    g = torch.Generator().manual_seed(support_size)
    edge = float(inverse_scalar_transform(torch.tensor(float(support_size))))
    x = torch.cat([torch.randn(3, 7, generator=g).flatten() * 3 * edge, torch.tensor([edge, -edge, 0.0])])
    x = x.view(-1, 4)  # [6, 4]: two leading dims
    logits = torch.randn(*x.shape, 2 * support_size + 1, generator=g, dtype=torch.float64, requires_grad=True)
    dense = -(scalar_to_target(x.double(), support_size=support_size) * torch.log_softmax(logits, -1)).sum(-1)
    (g_dense,) = torch.autograd.grad(dense.sum(), logits)
    fast = two_hot_cross_entropy(logits, x.double(), support_size=support_size)
    (g_fast,) = torch.autograd.grad(fast.sum(), logits)
    assert fast.shape == x.shape
    torch.testing.assert_close(fast, dense)
    torch.testing.assert_close(g_fast, g_dense)


_LOG_SOFTMAX_CHECK = """
import torch, torch.nn.functional as F
from muzero_tune.models.ops import log_softmax_last
torch.set_num_threads(1)
bad = []
for lead in [(7,), (16,), (100,), (256,), (256, 5), (6, 5), (1281,)]:
    for c in (2, 3, 5, 7, 8, 9, 11, 15, 16, 17, 101):
        torch.manual_seed(c)
        x = (torch.randn(*lead, c) * 4).requires_grad_()
        g = torch.randn(*lead, c)
        want = F.log_softmax(x, dim=-1)
        (want_grad,) = torch.autograd.grad(want, x, g)
        got = log_softmax_last(x)
        (got_grad,) = torch.autograd.grad(got, x, g)
        if not (got.shape == want.shape and torch.equal(got, want) and torch.equal(got_grad, want_grad)):
            bad.append((lead, c))
print(torch.backends.cpu.get_cpu_capability(), bad)
"""


@pytest.mark.parametrize("capability", [None, "avx2"])
def test_log_softmax_last_equals_torch_bit_for_bit(capability):
    """models/ops.py's faster CPU layout for short last dims is a layout change only: values and gradients
    equal ``F.log_softmax(x, -1)``'s bit for bit, for short and long last dims and row counts on and off
    the vector width, under this CPU's SIMD dispatch and under AVX2's (``ATEN_CPU_CAPABILITY``)."""
    env = dict(os.environ)
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    out = subprocess.run([sys.executable, "-c", _LOG_SOFTMAX_CHECK], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()  # fmt: skip
    if capability:
        assert out[0] == capability.upper()
    assert out[1:] == ["[]"]
