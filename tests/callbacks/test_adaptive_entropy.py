"""Skywork-OR1's adaptive entropy control: the rule by hand and against the authors' controller, and in a run."""

import random

import numpy as np
import pytest

from rlvr_lightning.advantages import GroupNormalizedAdvantage
from rlvr_lightning.callbacks import AdaptiveEntropyControl
from rlvr_lightning.core.entropy import adaptive_entropy_coefficient
from rlvr_lightning.modules import RLVRModule, SFTModule
from rlvr_lightning.rewards import SortInclusionOrderingReward

from ..modules.test_rlvr_module import fit, policy


class AuthorsEntController:
    """Skywork-OR1's `EntController` (SkyworkAI/Skywork-OR1 64e96af, verl/trainer/ppo/core_algos.py), restated."""

    def __init__(self, init_ent_coef, max_ent_coef, min_ent_coef, delta_ent_coef, target_ent):
        self.value, self.max_value, self.min_value = init_ent_coef, max_ent_coef, min_ent_coef
        self.delta_ent_coef, self.target_ent = delta_ent_coef, target_ent
        self.entropy_loss_enabled = 1

    def update(self, current_ent):
        if current_ent < self.target_ent:
            self.value += self.delta_ent_coef
        else:
            self.value -= self.delta_ent_coef
        self.value = float(np.clip(self.value, self.min_value, self.max_value))
        self.entropy_loss_enabled = int(current_ent < self.target_ent)


def test_the_rule_by_hand():
    # target 0.2, delta 0.01, coefficient in [0, 0.015], starting at 0
    coef, weights = 0.0, []
    for entropy in [0.3, 0.1, 0.1, 0.3, 0.1, 0.2]:
        coef, on = adaptive_entropy_coefficient(coef, entropy, 0.2, 0.01, 0.0, 0.015)
        weights.append(round(coef if on else 0.0, 12))
    # above: floor 0, off; under: 0.01, on; under: capped 0.015; above: 0.005, off; under: 0.015; at the target: off
    assert weights == [0.0, 0.01, 0.015, 0.0, 0.015, 0.0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agrees_with_the_authors_controller(seed):
    rng = random.Random(seed)
    target, delta, low, high, start = 0.2, 1e-3, 1e-4, 5e-3, 2e-3
    authors = AuthorsEntController(start, high, low, delta, target)
    ours = AdaptiveEntropyControl(target=target, delta=delta, max_coef=high, min_coef=low, initial_coef=start)
    for _ in range(200):
        assert ours.weight == authors.value * authors.entropy_loss_enabled
        entropy = rng.uniform(0.0, 0.4)
        authors.update(entropy)
        ours.coef, ours.enabled = adaptive_entropy_coefficient(ours.coef, entropy, target, delta, low, high)


def test_in_a_run_each_step_trains_with_the_weight_the_previous_entropy_set(in_tmp_dir):
    control = AdaptiveEntropyControl(target=0.5, delta=0.02, max_coef=0.05)
    module = RLVRModule(policy(), group_size=4)
    _, recorder = fit(module, [SortInclusionOrderingReward(), GroupNormalizedAdvantage(), control], steps=6)
    entropies = [step["train/entropy"] for step in recorder.steps]
    applied = [step["train/entropy_coef"] for step in recorder.steps]
    assert min(entropies) < 0.5 < max(entropies), entropies  # the bonus switches on and off in these steps
    coef, on, expected = 0.0, True, []
    for entropy in entropies:
        expected.append(coef if on else 0.0)
        coef, on = adaptive_entropy_coefficient(coef, entropy, 0.5, 0.02, 0.0, 0.05)
    assert applied == pytest.approx(expected, abs=1e-7)
    assert any(weight > 0 for weight in applied)
    assert control.state_dict() == {"coef": pytest.approx(coef), "enabled": on}


def test_the_weight_reaches_the_loss(in_tmp_dir):
    """Pinned at 0.05 (a floor equal to the ceiling, the target never reached), the run is the one with
    `entropy_coef: 0.05`; with the bonus always off it is the one without a bonus."""

    def losses(entropy_coef, *callbacks):
        module = RLVRModule(policy(), group_size=4, entropy_coef=entropy_coef)
        _, recorder = fit(module, [SortInclusionOrderingReward(), GroupNormalizedAdvantage(), *callbacks], steps=3)
        return [step["train/loss"] for step in recorder.steps]

    pinned = AdaptiveEntropyControl(target=100.0, delta=0.01, max_coef=0.05, min_coef=0.05, initial_coef=0.05)
    assert losses(0.0, pinned) == losses(0.05)
    assert losses(0.0, AdaptiveEntropyControl(target=1e-9)) == losses(0.0)
    assert losses(0.05) != losses(0.0)


def test_resume_restores_the_controller():
    control = AdaptiveEntropyControl(target=0.2, delta=0.01, max_coef=0.05)
    control.coef, control.enabled = 0.03, False
    restored = AdaptiveEntropyControl(target=0.2, delta=0.01, max_coef=0.05)
    restored.load_state_dict(control.state_dict())
    assert (restored.coef, restored.enabled, restored.weight) == (0.03, False, 0.0)


def test_bad_settings_are_refused(in_tmp_dir):
    with pytest.raises(ValueError, match=r"delta=-0.1 is not valid"):
        AdaptiveEntropyControl(delta=-0.1)
    with pytest.raises(ValueError, match="min_coef <= initial_coef <= max_coef"):
        AdaptiveEntropyControl(initial_coef=0.01, max_coef=0.005)
    with pytest.raises(ValueError, match="model.entropy_coef=0.01 and AdaptiveEntropyControl both set"):
        fit(RLVRModule(policy(), group_size=2, entropy_coef=0.01), [AdaptiveEntropyControl()], steps=1)
    with pytest.raises(TypeError, match="SFTModule has none"):
        AdaptiveEntropyControl().setup(None, SFTModule(policy()), "fit")
