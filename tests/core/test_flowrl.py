"""FlowRL (arXiv:2509.15207): the loss, its group estimate of log Z and its gradient by hand, and equal to the
authors' `compute_flowrl_objective` (verl's recipe/flowrl) restated, given that log Z."""

import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core import FlowRL, aggregate_loss
from rlvr_lightning.core.losses.flow_balance import PartitionHead
from rlvr_lightning.core.losses.policy_losses import policy_loss

GROUP = dict(group_index=torch.tensor([5, 5]), group_size=2)


def test_the_loss_and_its_gradient_by_hand():
    log_probs = torch.tensor([[-1.0, -3.0], [-1.0, -9.0]], requires_grad=True)
    ref = torch.tensor([[-2.0, -2.0], [-1.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # the second response has one token: its -9 never counts
    out = FlowRL(beta=15.0)(log_probs, None, torch.tensor([0.1, -0.1]), mask, ref_log_probs=ref, **GROUP)
    # residuals without log Z: -2 - 1.5 + 2 = -1.5 and -1 + 1.5 + 1.5 = 2; log Z = -(-1.5 + 2) / 2 = -0.25;
    # delta = -1.75, 1.75; w = 1 (on-policy): each response's loss 3.0625, on each of its tokens
    assert out.stats["flowrl_log_z"].item() == pytest.approx(-0.25)
    assert out.stats["flowrl_residual"].item() == pytest.approx(1.75)
    assert out.loss.tolist() == [pytest.approx([3.0625, 3.0625]), pytest.approx([3.0625, 0.0])]
    loss = aggregate_loss(out.loss, mask, "seq-mean-token-mean")
    assert loss.item() == pytest.approx(3.0625)
    loss.backward()
    # d/d log pi_t = 1/2 (the mean over responses) 2 delta / |y|: -1.75 / 2 on each token of the first, 1.75 on
    # the second's one token
    assert log_probs.grad.tolist() == [pytest.approx([-0.875, -0.875]), pytest.approx([1.75, 0.0])]


def test_the_trajectory_weight_is_clipped_and_weighs_log_z():
    old = torch.tensor([[-1.5], [-0.5]])
    log_probs = torch.tensor([[-1.0], [-1.0]])  # ratios e^0.5 = 1.65 and e^-0.5 = 0.61: clipped to 1.28 and 0.8
    ref = torch.tensor([[-1.0], [-3.0]])
    out = FlowRL(beta=1.0)(log_probs, old, torch.tensor([1.0, -1.0]), None, ref_log_probs=ref, **GROUP)
    # residuals: -1 - 1 + 1 = -1 and -1 + 1 + 3 = 3; log Z = -(1.28 (-1) + 0.8 (3)) / 2.08
    log_z = -(1.28 * -1 + 0.8 * 3) / 2.08
    assert out.stats["flowrl_log_z"].item() == pytest.approx(log_z)
    assert out.stats["flowrl_weight"].item() == pytest.approx(1.04)
    expected = [1.28 * (log_z - 1) ** 2, 0.8 * (log_z + 3) ** 2]
    assert out.loss.squeeze(-1).tolist() == pytest.approx(expected)
    assert out.ratio.squeeze(-1).tolist() == pytest.approx([math.exp(0.5), math.exp(-0.5)])
    assert out.stats["clip_frac_high"].item() == pytest.approx(0.5)
    assert out.stats["clip_frac_low"].item() == pytest.approx(0.5)


def test_an_empty_response_leaves_log_z_alone():
    log_probs = torch.tensor([[-1.0], [-2.0], [-7.0]])
    ref = torch.tensor([[-1.0], [-1.0], [0.0]])
    mask = torch.tensor([[1.0], [1.0], [0.0]])
    group = dict(group_index=torch.tensor([0, 0, 0]), group_size=3)
    out = FlowRL(beta=1.0)(log_probs, None, torch.zeros(3), mask, ref_log_probs=ref, **group)
    # residuals 0 and -1 over the two real responses: log Z 0.5 (the empty one would pull it to 1/3)
    assert out.stats["flowrl_log_z"].item() == pytest.approx(0.5)
    assert out.loss.squeeze(-1).tolist() == pytest.approx([0.25, 0.25, 0.0])


def _authors_flowrl(log_prob, ref_log_prob, old_log_prob, log_z, reward, response_mask, beta, low, high):
    """The authors' ``compute_flowrl_objective`` with its clipped trajectory weight (verl's recipe/flowrl
    ``flowrl_actor.py``, ``compute_flowrl_cispo_clip_ablation`` at 40dc8ef), restated."""

    def masked_mean(x, m):
        return (x * m).sum(-1) / m.sum(-1)

    avg_log_prob = masked_mean(log_prob, response_mask)
    avg_ref_log_prob = masked_mean(ref_log_prob, response_mask)
    seq_log_reward = masked_mean(reward, response_mask)
    delta = log_z + avg_log_prob - beta * seq_log_reward - avg_ref_log_prob
    log_w = ((log_prob - old_log_prob) * response_mask).sum(-1)
    imp_w = torch.clamp(torch.exp(log_w).detach(), 1 - low, 1 + high)
    return torch.mean(imp_w * delta**2)


@pytest.mark.parametrize("group_size", [2, 4])
def test_equals_the_authors_objective_at_the_minimising_log_z_in_value_and_gradient(group_size):
    generator = torch.Generator().manual_seed(0)
    loss_fn = FlowRL(beta=15.0, clip_low=0.2, clip_high=0.28)
    for _ in range(50):
        groups, t = torch.randint(1, 4, (2,), generator=generator).tolist()
        n = groups * group_size
        old = torch.log(torch.rand(n, t, generator=generator).clamp_min(1e-3))
        log_probs = (old + 0.2 * torch.randn(n, t, generator=generator)).clamp_max(0.0)
        ref = old + 0.3 * torch.randn(n, t, generator=generator)
        rewards = torch.rand(groups, group_size, generator=generator)
        advantages = ((rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-6)).flatten()
        mask = (torch.rand(n, t, generator=generator) < 0.8).float()
        mask[:, 0] = 1.0
        uid = torch.randperm(groups, generator=generator).repeat_interleave(group_size)
        ours_lp, theirs_lp = log_probs.clone().requires_grad_(), log_probs.clone().requires_grad_()
        out = loss_fn(ours_lp, old, advantages, mask, ref_log_probs=ref, group_index=uid, group_size=group_size)
        ours = aggregate_loss(out.loss, mask, "seq-mean-token-mean")
        # our log Z as the authors' learned one, a free value per row: the authors' objective is at its minimum
        log_z = torch.zeros(n)
        for row in range(n):
            same = uid == uid[row]
            residual = ((log_probs - ref) * mask).sum(-1) / mask.sum(-1) - 15.0 * advantages
            weight = torch.exp(((log_probs - old) * mask).sum(-1)).clamp(0.8, 1.28)
            log_z[row] = -(weight[same] * residual[same]).sum() / weight[same].sum()
        log_z.requires_grad_()
        reward = advantages.unsqueeze(-1).expand(n, t)
        theirs = _authors_flowrl(theirs_lp, ref, old, log_z, reward, mask, 15.0, 0.2, 0.28)
        assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
        ours.backward()
        theirs.backward()
        assert_close(ours_lp.grad, theirs_lp.grad, rtol=1e-5, atol=1e-6)
        # each group's log Z minimises the loss: the gradient in it (the sum over the group's rows) vanishes
        per_group = torch.zeros(groups).index_add_(0, uid, log_z.grad)
        assert_close(per_group, torch.zeros(groups), atol=1e-5, rtol=0)


def test_options_modes_and_inputs_are_checked():
    with pytest.raises(ValueError, match="beta must be > 0, got 0"):
        FlowRL(beta=0)
    with pytest.raises(ValueError, match="clip_low must be < 1"):
        FlowRL(clip_low=1.0)
    with pytest.raises(ValueError, match="clip_high must be >= 0, got -0.1"):
        FlowRL(clip_high=-0.1)
    with pytest.raises(ValueError, match=r"aggregation.mode='token-mean' would weigh responses by their length"):
        FlowRL().check("token-mean")
    FlowRL().check("seq-mean-token-mean")
    with pytest.raises(ValueError, match="FlowRL needs the reference's log-probs and each row's group"):
        FlowRL()(torch.zeros(2, 2), None, torch.zeros(2), None, group_index=torch.tensor([0, 0]), group_size=2)
    cut = dict(ref_log_probs=torch.zeros(3, 2), group_index=torch.tensor([0, 0, 1]), group_size=2)
    with pytest.raises(ValueError, match=r"FlowRL estimates each group's log Z over its 2 rows.*holds 3 rows"):
        FlowRL()(torch.zeros(3, 2), None, torch.zeros(3), None, **cut)
    assert type(policy_loss("flowrl")) is FlowRL


class _AuthorsProjZ(torch.nn.Module):
    """The authors' ``ProjZModule`` (verl's recipe/flowrl ``flowrl_actor.py`` at 40dc8ef), restated."""

    def __init__(self, hidden_size, num_layers=3, dropout=0.1):
        super().__init__()
        layers = []
        for _ in range(num_layers - 1):
            layers.extend(
                [
                    torch.nn.Linear(hidden_size, hidden_size),
                    torch.nn.GELU(),
                    torch.nn.LayerNorm(hidden_size),
                    torch.nn.Dropout(dropout),
                ]
            )
        layers.append(torch.nn.Linear(hidden_size, 1))
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("layers", [1, 3])
def test_the_partition_head_is_the_authors_projz_module(layers):
    torch.manual_seed(0)
    ours, theirs = PartitionHead(6, layers, 0.1).eval(), _AuthorsProjZ(6, layers, 0.1).eval()
    theirs.load_state_dict(ours.state_dict())  # the same layers, in the same order
    hidden = torch.randn(5, 6)
    assert_close(ours(hidden), theirs(hidden).squeeze(-1))


class _Hidden(torch.nn.Module):
    hidden_size = 2


@pytest.mark.parametrize("z_input", ["prompt", "response_start"])
def test_a_learned_log_z_by_hand_and_its_gradient(z_input):
    loss_fn = FlowRL(beta=1.0, log_z="learned", z_layers=1, z_input=z_input)
    head = loss_fn.attach(_Hidden())
    assert isinstance(head, PartitionHead) and not loss_fn.reads_groups
    assert (loss_fn.reads_prompt_state, loss_fn.reads_hidden) == (z_input == "prompt", z_input == "response_start")
    with torch.no_grad():  # log Z = h_0 + h_1 + 0.5 of the prompt's summary, or the state the first token is drawn from
        head.net[0].weight.fill_(1.0)
        head.net[0].bias.fill_(0.5)
    hidden = torch.tensor([[[0.25, 0.25], [9.0, 9.0]], [[-1.0, 0.0], [9.0, 9.0]]], requires_grad=True)
    log_probs = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.5], [-1.0, -1.0]])
    state = {"prompt_state": hidden[:, 0]} if z_input == "prompt" else {"hidden": hidden}
    out = loss_fn(log_probs, None, torch.tensor([0.5, -0.5]), None, ref_log_probs=ref, **state)
    # log Z = 1.0 and -0.5; residuals -1 - 0.5 + 1.5 = 0 and -2 + 0.5 + 1 = -0.5: delta = 1.0 and -1.0
    assert out.stats["flowrl_log_z"].item() == pytest.approx(0.25)
    assert out.loss.tolist() == [pytest.approx([1.0, 1.0]), pytest.approx([1.0, 1.0])]
    aggregate_loss(out.loss, None, "seq-mean-token-mean").backward()
    # the head learns from the same loss: d/d bias = mean_i 2 w delta_i = 0, d/d w_j = mean_i 2 delta_i h_ij
    assert head.net[0].bias.grad.item() == pytest.approx(0.0)
    assert head.net[0].weight.grad.tolist() == [pytest.approx([1.25, 0.25])]
    assert hidden.grad[:, 1].abs().sum().item() == 0.0  # only the first response position is read
    assert log_probs.grad.tolist() == [pytest.approx([0.5, 0.5]), pytest.approx([-0.5, -0.5])]


def test_a_learned_log_z_needs_a_policy_with_hidden_states():
    class NoHidden:
        @property
        def hidden_size(self):
            raise NotImplementedError("NoHidden does not expose hidden states")

    with pytest.raises(ValueError, match="log_z: learned reads the policy's hidden states: NoHidden does not"):
        FlowRL(log_z="learned").attach(NoHidden())
    assert FlowRL().attach(_Hidden()) is None  # log_z: group trains nothing beside the policy
    with pytest.raises(ValueError, match=r"log_z='fixed' is not valid; choose one of \['group', 'learned'\]"):
        FlowRL(log_z="fixed")
    with pytest.raises(ValueError, match=r"z_input='mean' is not valid; choose one of \['prompt', 'response_start'\]"):
        FlowRL(z_input="mean")
    with pytest.raises(ValueError, match="needs the reference's log-probs and the policy's prompt state"):
        FlowRL(log_z="learned")(torch.zeros(1, 1), None, torch.zeros(1), None, torch.zeros(1, 1))
    with pytest.raises(ValueError, match="builds its head in attach"):
        FlowRL(log_z="learned")(
            torch.zeros(1, 1), None, torch.zeros(1), None, torch.zeros(1, 1), prompt_state=torch.zeros(1, 2)
        )
