import math

import torch

from rlvr_lightning.modules.update.gradients import non_finite_gradients, total_norm


def test_total_gradient_norm_matches_torch():
    grads = [torch.tensor([3.0, 4.0]), torch.tensor([[12.0]])]
    assert total_norm(grads).item() == 13.0  # sqrt(9 + 16 + 144)
    mixed = [torch.tensor([3.0, 4.0]), torch.tensor([12.0], dtype=torch.float64)]
    torch.testing.assert_close(total_norm(mixed), torch.nn.utils.get_total_norm(mixed))
    assert total_norm([]).item() == 0.0


def test_the_norm_is_on_the_device_asked_for_even_without_gradients():
    meta = torch.device("meta")  # stands for the GPU a loss is on while offloaded gradients are CPU tensors
    assert total_norm([], device=meta).device == meta
    assert total_norm([torch.tensor([3.0, 4.0])], device=meta).device == meta
    assert total_norm([torch.tensor([3.0, 4.0])]).device == torch.device("cpu")


def test_non_finite_gradients_names_the_parameters_that_hold_them():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1), torch.nn.Linear(1, 1))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    model[1].weight.grad[0, 1] = math.nan
    model[2].bias.grad[0] = math.inf
    assert non_finite_gradients(model) == (["1.weight", "2.bias"], 2)
    assert non_finite_gradients(model, limit=1) == (["1.weight"], 2)
    model[1].weight.grad = model[2].bias.grad = None  # parameters without a gradient are left out
    assert non_finite_gradients(model) == ([], 0)
