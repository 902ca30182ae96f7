"""Comparisons the policy tests share."""


def masked_max_diff(a, b, mask) -> float:
    """The largest absolute difference of two tensors where `mask` is 1."""
    return ((a - b).abs() * mask).max().item()
