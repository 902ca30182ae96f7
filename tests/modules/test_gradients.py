import torch

from rlvr_lightning.modules.gradients import total_norm


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
