"""The clipped value loss and explained variance against hand-computed numbers."""

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.losses.value_loss import explained_variance, value_loss


def test_clipped_value_loss_by_hand():
    values = torch.tensor([[1.0, 0.0, 0.6, 3.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.5, 0.5]])
    returns = torch.tensor([[2.0, 0.0, 2.0, 2.0]])
    out = value_loss(values, old, returns, None, clip_range=0.2)
    # t0: (1-2)^2 = 1 vs (0.7-2)^2 = 1.69 -> .845 (clipped);  t1: 0 vs (0.3-0)^2 = .09 -> .045 (clipped)
    # t2: moved .1 < .2: both (0.6-2)^2 = 1.96 -> .98;  t3: (3-2)^2 = 1 vs (0.7-2)^2 = 1.69 -> .845 (clipped)
    assert_close(out.loss, torch.tensor([[0.845, 0.045, 0.98, 0.845]]))
    assert out.clipped.tolist() == [[True, True, False, True]]
    out.loss.sum().backward()
    # where the clipped term wins, the value gets no gradient; elsewhere d/dV 1/2 (V - R)^2 = V - R
    assert_close(values.grad, torch.tensor([[0.0, 0.0, -1.4, 0.0]]))


def test_unclipped_and_masked():
    values = torch.tensor([[1.0, 5.0], [0.0, 0.0]])
    returns = torch.tensor([[2.0, 0.0], [1.0, 3.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    out = value_loss(values, values.clone(), returns, mask, clip_range=None)
    assert_close(out.loss, torch.tensor([[0.5, 0.0], [0.5, 4.5]]))
    assert not out.clipped.any()


def test_value_loss_rejects_bad_input():
    with pytest.raises(ValueError, match="one shape"):
        value_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 3), None)
    with pytest.raises(ValueError, match="clip_range must be > 0"):
        value_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), None, clip_range=0.0)


def test_explained_variance_by_hand():
    # residual [0, 0, 1]: var 2/9; returns [1, 2, 4]: var 14/9 -> 1 - 1/7
    values, returns = torch.tensor([[1.0, 2.0, 3.0, 9.0]]), torch.tensor([[1.0, 2.0, 4.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert_close(explained_variance(values, returns, mask), torch.tensor(6.0 / 7.0))
    assert_close(explained_variance(returns, returns, mask), torch.tensor(1.0))
    assert float(explained_variance(values, torch.ones(1, 4), None)) == 0.0  # constant returns: 0, not NaN
