import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.pass_at_k import pass_at_k, pass_at_k_tensor


def test_hand_values():
    assert pass_at_k(2, 1, 1) == pytest.approx(0.5)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c / n
    assert pass_at_k(10, 0, 5) == 0.0


def test_certain_when_fewer_wrong_than_k():
    assert pass_at_k(4, 3, 2) == 1.0  # only 1 wrong sample, any 2 include a correct one
    assert pass_at_k(3, 3, 1) == 1.0


def test_invalid_arguments():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="c must be"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="k >= 1"):
        pass_at_k(3, 1, 0)


def test_tensor_version():
    out = pass_at_k_tensor(5, torch.tensor([0, 2, 5, 4]), 2)
    assert out.dtype == torch.float32
    assert_close(out, torch.tensor([0.0, 0.7, 1.0, 1.0]))
    assert_close(pass_at_k_tensor(10, torch.tensor([3, 0]), 1), torch.tensor([0.3, 0.0]))
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k_tensor(2, torch.tensor([1]), 3)
    with pytest.raises(ValueError, match="correct counts"):
        pass_at_k_tensor(2, torch.tensor([3]), 1)
