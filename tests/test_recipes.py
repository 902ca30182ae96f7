"""Every recipe in configs/recipes runs on the sort task through `rlvr`, is the algorithm its comment
names, and a recipe made contradictory on the command line fails at start-up saying why; docs/algorithms.md lists
every recipe and loss shorthand."""

import inspect
import re
from pathlib import Path

import pytest
import torch
import yaml

from rlvr_lightning import advantages
from rlvr_lightning.callbacks import AdaptiveEntropyControl
from rlvr_lightning.cli.app import main
from rlvr_lightning.core.losses.policy_losses import POLICY_LOSSES
from rlvr_lightning.rewards import UnlikelinessReward
from tests.recipe_expectations import EXPECTED

RECIPES_DIR = Path(__file__).resolve().parents[1] / "configs" / "recipes"


def _trains_rlvr_module(path: Path) -> bool:
    model = (yaml.safe_load(path.read_text()) or {}).get("model") or {}
    return model.get("class_path", "").endswith((".RLVRModule", ".PPOModule"))


# the RL recipes (the SFT / expert-iteration stage configs are tested in tests/modules)
RECIPES = [path for path in sorted(RECIPES_DIR.glob("*.yaml")) if _trains_rlvr_module(path)]
QUICK = [
    "--trainer.limit_train_batches=2",
    "--trainer.val_check_interval=2",
    "--trainer.limit_val_batches=1",
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.enable_model_summary=false",
]


def test_there_is_a_recipe_per_algorithm():
    assert {r.stem for r in RECIPES} == set(EXPECTED)


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_recipe_names_its_paper(recipe):
    header = "".join(line for line in recipe.read_text().splitlines(keepends=True) if line.startswith("#"))
    assert re.search(r"(19|20)\d\d", header.split("\n#\n")[0]), "the first comment block names the paper and its year"


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_recipe_runs_two_steps_on_the_sort_task(recipe, in_tmp_dir):
    cli = main(["fit", "--config", str(recipe), *QUICK])
    module, expected = cli.model, EXPECTED[recipe.stem]
    assert cli.trainer.fit_loop.epoch_loop._batches_that_stepped == 2
    metrics = cli.trainer.callback_metrics
    assert torch.isfinite(metrics["train/loss"]) and 0 <= float(metrics["val/accuracy"]) <= 1
    assert type(module.advantage_estimator) is expected["advantage"]
    assert type(module.loss) is POLICY_LOSSES[expected["loss"]]
    if "clip" in expected:
        assert (module.loss.clip_low, module.loss.clip_high) == pytest.approx(expected["clip"])
    read = {
        "aggregation": lambda: module.aggregation.mode,
        "loss_constant": lambda: module.loss_constant,
        "dynamic_sampling": lambda: module.dynamic_sampling.enabled,
        "replay": lambda: module.replay.size if module.replay is not None else 0,
        "value_model": lambda: module.value.model,
        "gae": lambda: (module.gae.lam, module.gae.lam_critic, module.value.warmup_steps),
        "vapo": lambda: (module.gae.length_adaptive_alpha, module.policy_update.positive_nll_coef),
        "teacher": lambda: type(module.teacher.policy),
        "distillation": lambda: (
            module.policy_update.distillation.coef,
            module.policy_update.distillation.rl_coef,
            module.policy_update.distillation.position_weight_gamma,
        ),
        "logit_distillation": lambda: (
            module.policy_update.distillation.mode,
            module.policy_update.distillation.topk,
            module.policy_update.distillation.support,
            module.policy_update.distillation.alpha,
            module.policy_update.distillation.add_tail,
        ),
        "baseline": lambda: module.advantage_estimator.baseline,
        "normalization": lambda: (
            module.advantage_estimator.std_scope,
            module.advantage_estimator.scale_by_valid_groups,
        ),
        "off_policy_mask_threshold": lambda: module.rollout_is.off_policy_mask_threshold,
        "group": lambda: (module.group_size, cli.datamodule.batch_size),
        "prompt_level": lambda: (
            module.update.shuffle,
            module.aggregation.mask_zero_variance_groups,
            module.aggregation.count_empty_rows,
        ),
        "pass_at": lambda: (module.advantage_estimator.k, module.advantage_estimator.baseline),
        "gdpo_weights": lambda: [
            module.advantage_estimator.weight(name) for name in ("sort_inclusion_ordering", "sort_distance")
        ],
        "wrapped": lambda: (
            next(k for k, cls in POLICY_LOSSES.items() if type(module.loss.loss) is cls),
            (module.loss.loss.clip_low, module.loss.loss.clip_high),
            module.loss.top_quantile,
        ),
        "shaped": lambda: (
            next(k for k, cls in POLICY_LOSSES.items() if type(module.loss.loss) is cls),
            (module.loss.loss.clip_low, module.loss.loss.clip_high),
            module.loss.alpha,
            module.loss.kappa,
        ),
        "demonstrations": lambda: (module.demonstrations.per_group, module.demonstrations.key, module.group_size),
        "luffy": lambda: (
            module.loss.gamma,
            next(k for k, cls in POLICY_LOSSES.items() if type(module.loss.on_policy) is cls),
            (module.loss.on_policy.clip_low, module.loss.on_policy.clip_high),
        ),
        "m2_threshold": lambda: module.loss.m2_threshold,
        "gvpo": lambda: (module.loss.beta, module.update.shuffle),
        "flowrl": lambda: (module.loss.beta, module.loss.clip_low, module.loss.clip_high, module.update.shuffle),
        "simko": lambda: tuple(
            getattr(module.loss, name)
            for name in ("top_k", "mix_coef", "entropy_quantile", "negative_scale", "clip_low", "clip_high")
        ),
        "bapo": lambda: tuple(
            getattr(module.loss, name)
            for name in (
                "target",
                "lower",
                "upper",
                "lower_step",
                "upper_step",
                "raise_first",
                "probability_weighted",
                "dual_clip",
            )
        ),  # fmt: skip
        "dynamic_clip": lambda: (module.loss.max_ratio, module.loss.dual_clip),
        "archer": lambda: tuple(
            getattr(module.loss, name)
            for name in (
                "quantile",
                "clip_low_entropy",
                "clip_high_entropy",
                "dual_clip",
                "kl_coef",
                "high_entropy_kl_coef",
            )
        ),
        "scale_by_std": lambda: module.advantage_estimator.scale_by_std,
        "unlikeliness": lambda: next(c.penalty for c in cli.trainer.callbacks if isinstance(c, UnlikelinessReward)),
        "prorl": lambda: (
            module.sampling.temperature,
            module.kl.clamp,
            module.kl.refresh_every,
            module.kl.reset_optimizer,
        ),
        "tracker": lambda: tuple(
            getattr(module.advantage_estimator, name)
            for name in ("prior_samples", "rho", "rho_min", "rho_max", "d_half", "reward_low", "reward_high")
        ),
        "group_filter": lambda: (module.group_filter.keep, module.group_filter.metric),
        "quantile": lambda: (module.advantage_estimator.quantile, module.advantage_estimator.quantile_method),
        "baseline_shift": lambda: module.advantage_estimator.baseline_shift,
        "positive_weight": lambda: (module.advantage_estimator.positive_weight, module.advantage_estimator.correct_at),
        "optimal_value": lambda: (
            module.advantage_estimator.beta1,
            module.advantage_estimator.num_samples,
            module.loss.beta2,
            module.group_size,
        ),
        "entropy_control": lambda: next(
            (c.target, c.delta, c.max_coef) for c in cli.trainer.callbacks if isinstance(c, AdaptiveEntropyControl)
        ),
        "cov": lambda: tuple(v for k, v in vars(module.loss).items() if k.startswith(("clip_cov", "kl_cov", "ppo_kl"))),
    }
    for option, value in read.items():
        if option in expected:
            assert value() == expected[option]
    if "teacher" not in expected:
        assert module.teacher is None
    if expected["kl"] is None:
        assert module.reference is None or module.loss.reads_reference
    else:
        assert (module.kl.coef, module.kl.estimator, module.kl.mode) == expected["kl"]


@pytest.mark.parametrize(
    "recipe, overrides, message",
    [
        # a negative clip range
        ("gspo", ["--model.init_args.loss.init_args.clip_low=-0.1"], "GSPO: clip_low must be >= 0"),
        # a sequence-level objective aggregated by token sums
        ("gspo", ["--model.init_args.aggregation.mode=seq-mean-token-sum"], "GSPO is a sequence-level objective"),
        # LUSPO's length weight is its aggregation
        ("luspo", ["--model.init_args.aggregation.mode=seq-mean-token-mean"], "LUSPO weighs each sequence's loss"),
        # a group baseline with a single response per prompt
        ("reinforce_pp_baseline", ["--model.init_args.group_size=1"], "BatchWhitenedAdvantage needs group_size >= 2"),
        # a per-token group baseline with a single response per prompt
        ("otb", ["--model.init_args.group_size=1"], "OptimalTokenBaseline needs group_size >= 2"),
        # a greedy baseline for the step's prompts while dynamic sampling trains on others
        (
            "remax",
            ["--model.init_args.dynamic_sampling.enabled=true"],
            "GreedyBaselineAdvantage decodes a greedy response to each prompt of the step's batch",
        ),
        # as many demonstrations as the group holds
        ("luffy", ["--model.init_args.demonstrations.per_group=8"], "per_group=8 must be below group_size=8"),
        # demonstrations trained as if sampled
        ("luffy", ["--model.init_args.loss=ppo_clip"], "would train as sampled responses; use loss: luffy"),
        # a negative second-moment bound
        ("m2po", ["--model.init_args.loss.init_args.m2_threshold=-1"], "M2PO: m2_threshold must be >= 0"),
        # a ratio bound that is no bound
        ("dcpo", ["--model.init_args.loss.init_args.max_ratio=1"], "DynamicClip: max_ratio must be > 1"),
        # a standardization within groups of one response
        ("dcpo", ["--model.init_args.group_size=1"], "SmoothStandardizedAdvantage needs group_size >= 2"),
        # new prompts sampled for the step's batch while dynamic sampling trains on others
        (
            "spo",
            ["--model.init_args.dynamic_sampling.enabled=true", "--model.init_args.group_size=2"],
            "ValueTrackerAdvantage samples the policy on each prompt met for the first time",
        ),
        # GVPO's groups dealt row by row into mini-batches: a group's log-ratios could not be centred
        ("gvpo", ["--model.init_args.update.shuffle=rows"], "GVPO reads whole prompt groups in each micro-batch"),
        # FlowRL's log Z estimated over groups dealt row by row into mini-batches
        ("flowrl", ["--model.init_args.update.shuffle=rows"], "FlowRL reads whole prompt groups in each micro-batch"),
        # SimKO without a candidate to spread a correct response's push over
        ("simko", ["--model.init_args.loss.init_args.top_k=0"], "SimKO: top_k must be >= 1"),
        # Archer's entropy quantile outside [0, 1]
        ("archer", ["--model.init_args.loss.init_args.quantile=1.5"], "Archer: quantile must be in"),
        # ASPO's weight without a cap
        ("aspo", ["--model.init_args.loss.init_args.dual_clip=null"], "ASPO: dual_clip must be a number > 1"),
        # BAPO's lower bound's range above 1
        ("bapo", ["--model.init_args.loss.init_args.lower=[0.6, 1.1]"], "BAPO: the bounds' ranges must satisfy"),
        # a divergence DPPO does not know
        ("dppo", ["--model.init_args.loss.init_args.divergence=js"], r"DPPO: divergence='js' is not valid"),
        # GMPO's per-response objective aggregated over tokens
        ("gmpo", ["--model.init_args.aggregation.mode=token-mean"], "GMPO's objective is the mean of each response's"),
        # an entropy bonus whose cap could cancel a negative advantage
        ("entropy_advantage", ["--model.init_args.loss.init_args.kappa=1"], "kappa must be > 1"),
        # one squared error per response, weighed by its length
        ("astar_po", ["--model.init_args.aggregation.mode=token-mean"], "would weigh responses by their length"),
        # an entropy bonus set twice
        ("adaptive_entropy", ["--model.init_args.entropy_coef=0.01"], "and AdaptiveEntropyControl both set"),
        # a gate temperature of 0
        ("sapo", ["--model.init_args.loss.init_args.temperature_neg=0"], "SAPO: temperature_neg must be > 0"),
        # dynamic sampling with one response per prompt: every group has zero variance
        ("dapo", ["--model.init_args.group_size=1"], "dynamic_sampling drops groups whose rewards all agree"),
        # switching GRPO's KL off but keeping its reference refresh
        ("grpo", ["--model.init_args.kl.coef=0"], "kl.refresh_every refreshes the KL reference, but kl.coef=0"),
        # a mixup weight outside (0, 1]
        ("max_reward", ["--model.init_args.kl.mixup_alpha=1.5"], r"kl.mixup_alpha=1.5 is not valid: .* in \(0, 1\]"),
        # an optimizer reset without the reference resets it goes with
        ("prorl", ["--model.init_args.kl.refresh_every=null"], "kl.reset_optimizer resets the optimizer at each"),
        # likelihood ranks within groups of one response
        ("unlikeliness", ["--model.init_args.group_size=1"], "UnlikelinessReward ranks the responses within each"),
        # a group baseline with a single response per prompt
        ("reinforce_baseline", ["--model.init_args.group_size=1"], "CenteredAdvantage needs group_size >= 2"),
        # pass@k with k as large as the group: every draw is the whole group
        ("passk", ["--model.init_args.group_size=4"], r"baseline='mean' need 1 <= k <= 3, got k=4"),
        # RLOO's leave-one-out baseline with a single response per prompt
        ("rloo", ["--model.init_args.group_size=1"], "RLOOAdvantage needs group_size >= 2"),
        # mini-batches that do not tile the rollout
        (
            "dapo",
            ["--model.init_args.update.mini_batch_size=300"],
            "update.mini_batch_size=300 must divide the rollout size",
        ),
        # a teacher whose token ids mean something else
        (
            "distill",
            ["--model.init_args.teacher.init_args.vocab_size=12"],
            "teacher: SortTeacher does not share the policy's tokenizer",
        ),
        # PPO's advantages come from its critic, not from a group baseline
        (
            "ppo",
            ["--trainer.callbacks+=rlvr_lightning.advantages.CenteredAdvantage"],
            "PPOModule estimates advantages with GAE",
        ),
    ],
)
def test_contradictory_recipe_fails_at_start_up(recipe, overrides, message, in_tmp_dir):
    with pytest.raises(ValueError, match=message):
        main(["fit", "--config", str(RECIPES_DIR / f"{recipe}.yaml"), *overrides, *QUICK])


LENGTH_BIAS = {
    "grpo": dict(advantage=advantages.GroupNormalizedAdvantage, aggregation="seq-mean-token-mean"),
    "dr_grpo": dict(advantage=advantages.CenteredAdvantage, aggregation="seq-sum-constant"),
    "gfpo": dict(advantage=advantages.GroupNormalizedAdvantage, aggregation="token-mean", keep=8),
}


@pytest.mark.parametrize("name", sorted(LENGTH_BIAS))
def test_length_bias_configs_run_and_log_length_by_correctness(name, in_tmp_dir):
    # the configs name their tokenizer relative to the repository root, as scripts/compare.py runs them; here, in a
    # directory of its own (another test may run the same config's name at the same time), it is made absolute
    path = RECIPES_DIR.parent / "length_bias" / f"{name}.yaml"
    tokenizer = f"--model.init_args.policy.init_args.model.tokenizer={path.parent / 'digits_tokenizer'}"
    cli = main(["fit", "--config", str(path), tokenizer, *QUICK[:1], "--trainer.limit_val_batches=0", *QUICK[3:]])
    module, metrics = cli.model, cli.trainer.callback_metrics
    assert type(module.advantage_estimator) is LENGTH_BIAS[name]["advantage"]
    assert module.aggregation.mode == LENGTH_BIAS[name]["aggregation"]
    assert module.policy.tokenizer.convert_ids_to_tokens(list(range(12))) == [*map(str, range(10)), "<eos>", "<pad>"]
    assert {"train/bias/length_incorrect", "train/bias/token_weight_long_over_short"} <= set(metrics)
    keep = LENGTH_BIAS[name].get("keep")
    assert module.group_filter.keep == keep
    assert module.last_rollout.num_rows == cli.datamodule.batch_size * (keep or module.group_size)
    if keep is not None:  # GFPO: the shortest half of each group of 16
        assert metrics["train/group_filter/length_kept"] < metrics["train/group_filter/length_sampled"]


def test_every_recipe_and_loss_shorthand_is_documented():
    from rlvr_lightning.modules import RLVRModule
    from rlvr_lightning.runtime.option_declarations import declared_options

    algorithms = (RECIPES_DIR.parents[1] / "docs" / "algorithms.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", algorithms, flags=re.MULTILINE))
    assert {path.stem for path in RECIPES_DIR.glob("*.yaml")} <= documented
    loss_row = next(line for line in algorithms.splitlines() if line.startswith("| `loss` |"))
    help_text = declared_options(RLVRModule)["loss"].help
    for shorthand in POLICY_LOSSES:
        assert f"`{shorthand}`" in loss_row, shorthand
        assert re.search(rf"\b{shorthand}\b", help_text), shorthand


def test_the_documented_ppo_options_are_ppomodules():
    import dataclasses

    from rlvr_lightning.modules import PPOModule
    from rlvr_lightning.modules.ppo_options import GAEConfig, ValueConfig

    algorithms = (RECIPES_DIR.parents[1] / "docs" / "algorithms.md").read_text()
    block = re.search(r"```yaml\n(model:\n  class_path: rlvr_lightning\.modules\.PPOModule\n.*?)```", algorithms, re.S)
    init_args = yaml.safe_load(block.group(1).replace("{...}", "{}"))["model"]["init_args"]
    assert set(init_args) <= set(inspect.signature(PPOModule).parameters) | {"loss"}
    for group, config in (("value", ValueConfig), ("gae", GAEConfig)):
        assert set(init_args[group]) == {field.name for field in dataclasses.fields(config)}, group
        config(**init_args[group])
