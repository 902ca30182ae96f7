"""`OptimalTokenBaseline` in a run: the module fills `rollout.token_energy` from the policy before the advantages,
and refuses at start-up a policy that cannot compute it."""

import pytest
import torch

from rlvr_lightning.advantages import OptimalTokenBaseline
from rlvr_lightning.core.advantage_estimators import optimal_token_baseline_advantages
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.options import UpdateConfig
from rlvr_lightning.policies.base import Policy
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import SortInclusionOrderingReward

from .test_algorithm_options import UpdateSpy
from .test_rlvr_module import fit


class EnergySpy(ToySortPolicy):
    """Records the energies it computes and the rows it computed them for."""

    def logit_statistics(self, rollout, statistic, temperature=1.0):
        energy = super().logit_statistics(rollout, statistic, temperature)
        self.computed = getattr(self, "computed", []) + [(rollout.response_ids.clone(), energy, temperature)]
        return energy


def test_the_advantages_are_otbs_of_the_policys_energies(in_tmp_dir):
    torch.manual_seed(0)
    policy = EnergySpy(vocab_size=5, prompt_length=3, embedding_dim=4, eos_token=4)
    module = UpdateSpy(policy, group_size=4, update=UpdateConfig(micro_batch_size=8))
    _, recorder = fit(module, [SortInclusionOrderingReward(), OptimalTokenBaseline()], steps=2, batch_size=4)
    assert len(policy.computed) == 4  # two micro-batches of 8 rows per step
    for step, rollout in enumerate(module.trained_on):
        parts = policy.computed[2 * step : 2 * step + 2]
        assert torch.equal(torch.cat([ids for ids, _, _ in parts]), rollout.response_ids)
        assert torch.equal(torch.cat([energy for _, energy, _ in parts]), rollout.token_energy)
        assert all(temperature == module.sampling.temperature for _, _, temperature in parts)
        expected = optimal_token_baseline_advantages(rollout.reward, rollout.response_mask, rollout.token_energy, 4)
        assert rollout.advantages.shape == rollout.response_ids.shape
        assert torch.equal(rollout.advantages, expected)
        assert (rollout.advantages[:, 0] != rollout.advantages[:, 1]).any()  # a baseline per token
        mean = rollout.token_energy[rollout.response_mask > 0].mean()
        assert recorder.steps[step]["train/token_energy_mean"] == pytest.approx(float(mean), rel=1e-6)


class NoEnergies(ToySortPolicy):
    logit_statistics = Policy.logit_statistics


def test_a_policy_without_token_energies_fails_at_start_up(in_tmp_dir):
    torch.manual_seed(0)
    module = RLVRModule(NoEnergies(vocab_size=5, prompt_length=3, embedding_dim=4), group_size=4)
    with pytest.raises(ValueError, match="OptimalTokenBaseline reads each token's energy, which NoEnergies does not"):
        fit(module, [SortInclusionOrderingReward(), OptimalTokenBaseline()], steps=1)
