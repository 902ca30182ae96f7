import torch

from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.policies.toy_sort import ToySortPolicy


def test_sample_shapes_and_groups():
    torch.manual_seed(0)
    policy = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)
    batch = {"prompt": [[1, 0, 2], [4, 3, 3]], "metadata": [{"answer": [0, 1, 2]}, {"answer": [3, 3, 4]}]}
    rollout = policy.sample(batch, n=3, sampling=SamplingConfig())
    assert rollout.response_ids.shape == (6, 3)
    assert rollout.group_index.tolist() == [0, 0, 0, 1, 1, 1]
    assert rollout.prompt_ids[3].tolist() == [4, 3, 3]
    assert rollout.metadata[4] == {"answer": [3, 3, 4]}
    assert rollout.response_mask.sum() == 18
    assert int(rollout.response_ids.max()) < 5


def test_log_probs_match_a_direct_computation():
    torch.manual_seed(0)
    policy = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)
    rollout = policy.sample({"prompt": [[1, 0, 2], [4, 3, 3]]}, n=2, sampling=SamplingConfig())
    log_probs, entropy = policy.token_log_probs(rollout, temperature=2.0, with_entropy=True)
    logits = policy(rollout.prompt_ids) / 2.0  # recompute per row, without sharing across the group
    expected = torch.log_softmax(logits, -1).gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(log_probs, expected)
    probs = logits.softmax(-1)
    torch.testing.assert_close(entropy, -(probs * probs.log()).sum(-1))


def test_sampling_hands_over_its_log_probs_exactly():
    torch.manual_seed(0)
    policy = ToySortPolicy(vocab_size=5, prompt_length=3, embedding_dim=4)
    for temperature in (1.0, 0.7):
        rollout = policy.sample(
            {"prompt": [[1, 0, 2], [4, 3, 3]]}, n=3, sampling=SamplingConfig(temperature=temperature)
        )
        log_probs, _ = policy.token_log_probs(rollout, temperature=temperature)
        assert torch.equal(rollout.old_log_probs, log_probs)  # bitwise: the first PPO ratio is exactly 1


def test_sampling_follows_the_softmax():
    torch.manual_seed(0)
    policy = ToySortPolicy(vocab_size=3, prompt_length=2, embedding_dim=4)
    rollout = policy.sample({"prompt": [[0, 1]]}, n=20000, sampling=SamplingConfig(temperature=1.0))
    probs = policy(torch.tensor([[0, 1]]))[0].softmax(-1)  # [R, V]
    counts = torch.stack([torch.bincount(rollout.response_ids[:, r], minlength=3) for r in range(2)]).float()
    torch.testing.assert_close(counts / 20000, probs, atol=0.015, rtol=0)


def test_greedy_takes_the_argmax():
    torch.manual_seed(0)
    policy = ToySortPolicy(vocab_size=6, prompt_length=4, embedding_dim=8)
    rollout = policy.sample({"prompt": [[5, 1, 0, 2]]}, n=2, sampling=SamplingConfig(do_sample=False))
    expected = policy(torch.tensor([[5, 1, 0, 2]]))[0].argmax(-1)
    assert rollout.response_ids.tolist() == [expected.tolist()] * 2


def test_reference_mixup_moves_by_alpha():
    torch.manual_seed(0)
    policy = ToySortPolicy(vocab_size=4, prompt_length=2, embedding_dim=3)
    reference = policy.create_reference()
    assert not any(p.requires_grad for p in reference.parameters())
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)
    before = [p.clone() for p in reference.parameters()]
    policy.update_reference(reference, alpha=0.25)
    for old, new in zip(before, reference.parameters(), strict=True):
        torch.testing.assert_close(new, old + 0.25)


def test_log_probs_stay_right_across_rollouts_and_row_selections():
    # the per-prompt layout is cached for the last rollout seen; other rollouts and selections must not reuse it
    torch.manual_seed(0)
    policy = ToySortPolicy(vocab_size=6, prompt_length=3)

    def direct(rollout):
        log_softmax = policy(rollout.prompt_ids).log_softmax(-1)
        return log_softmax.gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)

    first = policy.sample({"prompt": [[1, 2, 3], [5, 0, 0]]}, n=3, sampling=SamplingConfig())
    second = policy.sample({"prompt": [[4, 4, 1], [2, 2, 2], [0, 1, 0]]}, n=2, sampling=SamplingConfig())
    shuffled = first.select(torch.tensor([4, 0, 5, 1]))  # out of order
    unequal = first.select(torch.tensor([3, 4, 0]))  # runs of 2 and 1 rows
    for rollout in (first, first, second, shuffled, unequal, first):
        log_probs, entropy = policy.token_log_probs(rollout, with_entropy=True)
        torch.testing.assert_close(log_probs, direct(rollout))
        probs = policy(rollout.prompt_ids).softmax(-1)
        torch.testing.assert_close(entropy, -(probs * probs.log()).sum(-1))
