"""The learning figures about response lengths (docs/benchmarks.md): GRPO's length bias against Dr. GRPO's,
and GFPO's group filter, on the length-bias task (`configs/length_bias/`, a tiny random Llama sorting digits)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from learning_figure_parts import Band, Command, Curve, Figure, Metric, csv_final, csv_mean, difference, rlvr_fit


def fit(recipe: str, *extra: str, log_name: str | None = None) -> Command:
    """A length-bias recipe (its tokenizer path is relative to the repository)."""
    return rlvr_fit(f"configs/length_bias/{recipe}.yaml", *extra, cwd="repo", log_name=log_name or recipe)


def length_bias_figure() -> Figure:
    runs = {recipe: f"{recipe}/version_0/metrics.csv" for recipe in ("grpo", "dr_grpo")}
    # final train reward (of 3), mean length (tokens) of incorrect and of correct responses, truncated fraction
    bands = {
        "grpo": (Band(0.8, 1.2), Band(6.0, 8.5), Band(6.0, 8.8), Band(0.10, 0.20)),
        "dr_grpo": (Band(1.1, 1.7), Band(4.8, 6.5), Band(5.6, 7.3), Band(0.04, 0.10)),
    }

    def mean_of(recipe: str, column: str) -> Callable[[Path, int], float]:
        return csv_mean(runs[recipe], column)

    metrics = []
    for recipe, path in runs.items():
        reward, incorrect, correct, truncated = bands[recipe]
        metrics += [
            Metric(
                f"{recipe}_final_train_reward",
                csv_final(path, "train/reward_mean", 10),
                reward,
                f"mean of train/reward_mean over the last 10 steps of {path}",
            ),
            Metric(
                f"{recipe}_length_incorrect",
                mean_of(recipe, "train/bias/length_incorrect"),
                incorrect,
                "mean over the run of train/bias/length_incorrect",
            ),
            Metric(
                f"{recipe}_length_correct",
                mean_of(recipe, "train/bias/length_correct"),
                correct,
                "mean over the run of train/bias/length_correct (steps with a correct response)",
            ),
            Metric(
                f"{recipe}_truncated",
                mean_of(recipe, "train/generation/truncated_fraction"),
                truncated,
                "mean over the run of train/generation/truncated_fraction",
                percent=True,
            ),
        ]
    metrics += [
        Metric(
            "grpo_token_weight_long_over_short",
            mean_of("grpo", "train/bias/token_weight_long_over_short"),
            Band(0.4, 0.6),
            "mean over the GRPO run of train/bias/token_weight_long_over_short",
        ),
        Metric(
            "incorrect_longer_under_grpo",
            difference(
                mean_of("grpo", "train/bias/length_incorrect"), mean_of("dr_grpo", "train/bias/length_incorrect")
            ),
            Band(0.5),
            "GRPO's mean incorrect length minus Dr. GRPO's, same seed (tokens)",
        ),
        Metric(  # not on every seed: -0.13, 0.97 and 0.49 tokens on seeds 0, 1, 2 (2026-11-30)
            "correct_longer_under_grpo",
            difference(mean_of("grpo", "train/bias/length_correct"), mean_of("dr_grpo", "train/bias/length_correct")),
            Band(0.0, over="mean"),
            "GRPO's mean correct length minus Dr. GRPO's, same seed (tokens)",
        ),
        Metric(
            "dr_grpo_reward_gain",
            difference(
                csv_final(runs["dr_grpo"], "train/reward_mean", 10), csv_final(runs["grpo"], "train/reward_mean", 10)
            ),
            Band(0.15),
            "Dr. GRPO's final train reward minus GRPO's, same seed",
        ),
    ]
    return Figure(
        "length_bias",
        "docs/benchmarks.md: GRPO vs Dr. GRPO: response lengths (docs/length_bias.md)",
        (fit("grpo"), fit("dr_grpo")),
        tuple(metrics),
        curves=tuple(Curve(recipe, path, "train/bias/length_incorrect") for recipe, path in runs.items()),
    )


SAMPLED_LENGTH = "train/generation/response_length/mean"  # of every sampled response, before GFPO's filter


def gfpo_figure() -> Figure:
    """GFPO (the 8 shortest of 16 responses) against GRPO with GFPO's token-mean aggregation and 8 responses, and
    GRPO as shipped: the length of the responses the policy samples, and their reward, same seed."""
    runs = {name: f"{name}/version_0/metrics.csv" for name in ("gfpo", "grpo_token_mean", "grpo")}
    token_mean = fit("grpo", "--model.init_args.aggregation.mode=token-mean", log_name="grpo_token_mean")
    last = {name: csv_final(path, SAMPLED_LENGTH, 10) for name, path in runs.items()}
    truncated = {name: csv_mean(path, "train/generation/truncated_fraction") for name, path in runs.items()}
    metrics = (
        Metric(
            "gfpo_final_sampled_reward",
            csv_final(runs["gfpo"], "train/group_filter/reward_sampled", 10),
            Band(0.8, 1.2),
            "mean over the last 10 steps of train/group_filter/reward_sampled (all 16 responses)",
        ),
        Metric(
            "token_mean_final_reward",
            csv_final(runs["grpo_token_mean"], "train/reward_mean", 10),
            Band(1.0, 1.4),
            "GRPO with token-mean: mean of train/reward_mean over the last 10 steps",
        ),
        Metric(
            "kept_shorter_than_sampled",
            difference(
                csv_mean(runs["gfpo"], "train/group_filter/length_sampled"),
                csv_mean(runs["gfpo"], "train/group_filter/length_kept"),
            ),
            Band(1.0),
            "GFPO: mean over the run of the sampled length minus the kept length (tokens)",
        ),
        Metric(
            "gfpo_truncated",
            truncated["gfpo"],
            Band(0.15, 0.30),
            "mean over the run of train/generation/truncated_fraction",
            percent=True,
        ),
        Metric(
            "token_mean_truncated",
            truncated["grpo_token_mean"],
            Band(0.05, 0.13),
            "GRPO with token-mean: mean over the run of train/generation/truncated_fraction",
            percent=True,
        ),
        Metric(
            "more_truncated_than_token_mean",
            difference(truncated["gfpo"], truncated["grpo_token_mean"]),
            Band(0.05),
            "GFPO's truncated fraction minus GRPO token-mean's, same seed: the cut-off responses, never kept, are "
            "never pushed down",
            percent=True,
        ),
        Metric(
            "shorter_than_token_mean",
            difference(last["grpo_token_mean"], last["gfpo"]),
            Band(-1.5, 1.5, over="mean"),
            "GRPO token-mean's final sampled length minus GFPO's, same seed (tokens): no systematic difference",
        ),
    )
    return Figure(
        "gfpo_lengths",
        "docs/benchmarks.md: GFPO on the length-bias task",
        (fit("gfpo"), token_mean, fit("grpo")),
        metrics,
        curves=tuple(Curve(name, path, SAMPLED_LENGTH) for name, path in runs.items()),
        ylabel="mean length of the sampled responses (tokens)",
    )
