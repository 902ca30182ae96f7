"""What each recipe in configs/recipes must stay: the algorithm its paper prescribes (`tests/test_recipes.py`)."""

from rlvr_lightning import advantages
from rlvr_lightning.policies.sort_teacher import SortTeacher

# What each paper prescribes (the part a recipe must not lose to an edit).
EXPECTED = {
    "grpo": dict(
        advantage=advantages.GroupNormalizedAdvantage,
        loss="ppo_clip",
        clip=(0.2, 0.2),
        aggregation="seq-mean-token-mean",
        kl=(0.04, "k3", "loss"),
    ),
    "grpo_k3_is": dict(
        advantage=advantages.GroupNormalizedAdvantage,
        loss="ppo_clip",
        clip=(0.2, 0.2),
        aggregation="seq-mean-token-mean",
        kl=(0.04, "k3_is", "loss"),
    ),
    "gppo": dict(
        advantage=advantages.GroupNormalizedAdvantage,
        loss="gppo",
        clip=(0.2, 0.28),
        aggregation="token-mean",
        kl=None,
        dynamic_sampling=True,
    ),
    "entropy_advantage": dict(
        advantage=advantages.GroupNormalizedAdvantage,
        loss="entropy_shaped",
        aggregation="token-mean",
        kl=None,
        shaped=("ppo_clip", (0.2, 0.28), 0.4, 2.0),
    ),
    "adaptive_entropy": dict(
        advantage=advantages.GroupNormalizedAdvantage,
        loss="ppo_clip",
        clip=(0.2, 0.2),
        aggregation="token-mean",
        kl=None,
        dynamic_sampling=True,
        entropy_control=(0.1, 0.02, 1.0),
    ),
    "astar_po": dict(
        advantage=advantages.OptimalValueAdvantage,
        loss="astar_po",
        aggregation="seq-mean-token-mean",
        kl=None,
        optimal_value=(3.5, 8, 0.03, 1),
    ),
    "qae": dict(
        advantage=advantages.GroupNormalizedAdvantage,
        loss="ppo_clip",
        clip=(0.2, 0.28),
        aggregation="token-mean",
        kl=None,
        dynamic_sampling=True,
        quantile=(0.4, "inverted_cdf"),
    ),
    "high_entropy": dict(
        advantage=advantages.GroupNormalizedAdvantage,
        loss="high_entropy",
        aggregation="token-mean",
        kl=None,
        wrapped=("ppo_clip", (0.2, 0.28), 0.2),
    ),
    "clip_cov": dict(
        advantage=advantages.GroupNormalizedAdvantage,
        loss="clip_cov",
        clip=(0.2, 0.2),
        aggregation="token-mean",
        kl=None,
        cov=(2e-4, 1.0, 5.0),
    ),
    "kl_cov": dict(
        advantage=advantages.GroupNormalizedAdvantage, loss="kl_cov", aggregation="token-mean", kl=None, cov=(2e-3, 1.0)
    ),
    "grpo_opsm": dict(
        advantage=advantages.GroupNormalizedAdvantage,
        loss="ppo_clip",
        clip=(0.2, 0.2),
        aggregation="seq-mean-token-mean",
        kl=(0.04, "k3", "loss"),
        off_policy_mask_threshold=0.01,
    ),
    "gdpo": dict(
        advantage=advantages.NormalizeThenSumAdvantage,
        loss="ppo_clip",
        clip=(0.2, 0.2),
        aggregation="seq-mean-token-mean",
        kl=None,
        gdpo_weights=[1.0, 1.0],
    ),
    "passk": dict(
        advantage=advantages.PassAtKAdvantage,
        loss="ppo_clip",
        clip=(0.2, 0.2),
        aggregation="seq-mean-token-mean",
        kl=None,
        pass_at=(4, "mean"),
    ),
    "dr_grpo": dict(
        advantage=advantages.CenteredAdvantage,
        loss="ppo_clip",
        aggregation="seq-sum-constant",
        loss_constant=4.0,
        kl=None,
    ),
    "dapo": dict(
        advantage=advantages.GroupNormalizedAdvantage,
        loss="ppo_clip",
        clip=(0.2, 0.28),
        aggregation="token-mean",
        dynamic_sampling=True,
        kl=None,
    ),
    "gspo": dict(
        advantage=advantages.GroupNormalizedAdvantage,
        loss="gspo",
        clip=(3e-4, 4e-4),
        aggregation="seq-mean-token-mean",
        kl=None,
    ),
    "rloo": dict(advantage=advantages.RLOOAdvantage, loss="pg", kl=(0.01, "k1", "reward")),
    "reinforce_pp": dict(
        advantage=advantages.BatchWhitenedAdvantage, loss="ppo_clip", clip=(0.2, 0.2), kl=(0.01, "k1", "reward")
    ),
    "reinforce_pp_baseline": dict(
        advantage=advantages.BatchWhitenedAdvantage,
        baseline="group_mean",
        loss="ppo_clip",
        clip=(0.2, 0.2),
        kl=(0.01, "k1", "reward"),
    ),
    "cispo": dict(advantage=advantages.GroupNormalizedAdvantage, loss="cispo", aggregation="token-mean", kl=None),
    "sapo": dict(
        advantage=advantages.GroupNormalizedAdvantage, loss="sapo", aggregation="seq-mean-token-mean", kl=None
    ),
    "luspo": dict(
        advantage=advantages.GroupNormalizedAdvantage,
        loss="luspo",
        clip=(2e-3, 2.5e-3),
        aggregation="seq-mean-token-sum",
        kl=None,
    ),
    "vespo": dict(advantage=advantages.GroupNormalizedAdvantage, loss="vespo", aggregation="token-mean", kl=None),
    "dppo": dict(
        advantage=advantages.CenteredAdvantage,
        loss="dppo",
        clip=(0.15, 0.15),
        aggregation="seq-sum-constant",
        loss_constant=4.0,
        kl=None,
    ),
    "gmpo": dict(
        advantage=advantages.GroupNormalizedAdvantage,
        loss="gmpo",
        clip=(0.4, 0.4),
        aggregation="seq-mean-token-mean",
        kl=None,
    ),
    "otb": dict(
        advantage=advantages.OptimalTokenBaseline, loss="ppo_clip", clip=(0.2, 0.2), aggregation="token-mean", kl=None
    ),
    "remax": dict(
        advantage=advantages.GreedyBaselineAdvantage,
        loss="ppo_clip",
        clip=(0.2, 0.2),
        aggregation="token-mean",
        kl=(0.001, "k1", "reward"),
    ),
    "w_reinforce": dict(
        advantage=advantages.WeightedReinforceAdvantage,
        loss="ppo_clip",
        clip=(0.2, 0.2),
        aggregation="token-mean",
        kl=None,
        positive_weight=(0.1, None),
    ),
    "reinforce": dict(advantage=advantages.RawRewardAdvantage, loss="pg", aggregation="seq-mean-token-sum", kl=None),
    "topr": dict(advantage=advantages.CenteredAdvantage, loss="topr", aggregation="seq-mean-token-sum", kl=None),
    "asymre": dict(
        advantage=advantages.CenteredAdvantage,
        loss="pg",
        aggregation="seq-mean-token-sum",
        kl=None,
        baseline_shift=-0.35,
    ),
    # the std's scope and GPG's alpha
    "gpg": dict(
        advantage=advantages.GroupNormalizedAdvantage,
        loss="pg",
        aggregation="token-mean",
        kl=None,
        normalization=("group", True),
    ),
    "lite_ppo": dict(
        advantage=advantages.GroupNormalizedAdvantage,
        loss="ppo_clip",
        clip=(0.2, 0.2),
        aggregation="token-mean",
        kl=None,
        normalization=("batch", False),
    ),
    "reinforce_baseline": dict(
        advantage=advantages.CenteredAdvantage, loss="pg", aggregation="seq-mean-token-sum", kl=None
    ),
    "max_reward": dict(advantage=advantages.MaxOnlyAdvantage, loss="ppo_clip", kl=(0.08, "k3", "loss")),
    # the reward's advantages are computed but weighed 0: the scripted teacher's reverse KL alone
    "distill": dict(
        advantage=advantages.GroupNormalizedAdvantage,
        loss="ppo_clip",
        aggregation="token-mean",
        kl=None,
        teacher=SortTeacher,
        distillation=(1.0, 0.0),
    ),
    # no AdvantageCallback: GAE from a separate critic; VC-PPO: its value pretraining and decoupled lambdas
    "vc_ppo": dict(
        advantage=type(None),
        loss="ppo_clip",
        clip=(0.2, 0.2),
        aggregation="token-mean",
        kl=None,
        value_model="separate",
        gae=(0.95, 1.0, 10),
    ),
    "vapo": dict(
        advantage=type(None),
        loss="ppo_clip",
        clip=(0.2, 0.28),
        aggregation="token-mean",
        kl=None,
        value_model="separate",
        gae=(0.95, 1.0, 10),
        vapo=(0.05, 0.1),
    ),
    "ppo": dict(
        advantage=type(None),
        loss="ppo_clip",
        clip=(0.2, 0.2),
        aggregation="token-mean",
        kl=None,
        value_model="separate",
    ),
}
