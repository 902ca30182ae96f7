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
        "grpo": (Band(0.8, 1.2), Band(6.0, 8.5), Band(7.5, 8.8), Band(0.10, 0.20)),
        "dr_grpo": (Band(1.1, 1.6), Band(4.8, 6.5), Band(5.6, 7.3), Band(0.04, 0.10)),
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
        Metric(
            "correct_longer_under_grpo",
            difference(mean_of("grpo", "train/bias/length_correct"), mean_of("dr_grpo", "train/bias/length_correct")),
            Band(0.5),
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
    metrics = (
        Metric(
            "gfpo_final_sampled_reward",
            csv_final(runs["gfpo"], "train/group_filter/reward_sampled", 10),
            Band(0.6, 1.3),
            "mean over the last 10 steps of train/group_filter/reward_sampled (all 16 responses)",
        ),
        Metric("gfpo_length_last", last["gfpo"], Band(4.0, 7.5), f"mean of {SAMPLED_LENGTH} over the last 10 steps"),
        Metric(
            "token_mean_length_last",
            last["grpo_token_mean"],
            Band(5.0, 8.0),
            f"GRPO with token-mean: mean of {SAMPLED_LENGTH} over the last 10 steps",
        ),
        Metric(
            "shorter_than_token_mean",
            difference(last["grpo_token_mean"], last["gfpo"]),
            Band(-1.0),
            "GRPO token-mean's final sampled length minus GFPO's, same seed (tokens)",
        ),
        Metric(
            "shorter_than_grpo",
            difference(last["grpo"], last["gfpo"]),
            Band(0.5),
            "GRPO's final sampled length minus GFPO's, same seed (tokens)",
        ),
        Metric(
            "kept_shorter_than_sampled",
            difference(
                csv_mean(runs["gfpo"], "train/group_filter/length_sampled"),
                csv_mean(runs["gfpo"], "train/group_filter/length_kept"),
            ),
            Band(0.5),
            "GFPO: mean over the run of the sampled length minus the kept length (tokens)",
        ),
    )
    return Figure(
        "gfpo_lengths",
        "docs/benchmarks.md: GFPO: shorter responses by filtering",
        (fit("gfpo"), token_mean, fit("grpo")),
        metrics,
        curves=tuple(Curve(name, path, SAMPLED_LENGTH) for name, path in runs.items()),
        ylabel="mean length of the sampled responses (tokens)",
    )
