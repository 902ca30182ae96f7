"""The registry of every learning figure the documentation publishes (docs/benchmarks.md): how each is
produced, read and checked.

One `Figure` per published figure: the command(s) that produce one seed's run (the project's own
`rlvr fit` or scripts, never a copy of their logic), the seeds, and the metrics read from that run's
CSV/JSON output, each with the band docs/benchmarks.md states for it. `scripts/learning_suite.py` reruns
them and checks every seed against its band. The toy figures are here, the language-model ones in
`learning_figures_language_models.py`.

Command arguments may name `{python}` (this interpreter), `{repo}`, `{run_dir}` (one seed's empty
directory) and `{seed}` (plain text replacement, so JSON arguments keep their braces); a command runs
in `{run_dir}` unless it says `cwd="repo"` (configs that name files relative to the repository).
Paths that metrics read are relative to `{run_dir}` and may name `{seed}`. A directory shared by a figure's seeds
(one teacher) is `{run_dir}/../NAME`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_figure_parts import (  # noqa: E402
    CSV_LOG,
    Band,
    Command,
    Curve,
    Figure,
    Metric,
    csv_final,
    csv_nth,
    difference,
    json_value,
    rlvr_fit,
    toy_metrics,
)
from learning_figures_language_models import (  # noqa: E402
    ARITHMETIC_MIN_VAL_ACCURACY,
    REASONING_GYM_DATASETS,
    language_model_figures,
)
from learning_figures_lengths import gfpo_figure, length_bias_figure  # noqa: E402

__all__ = ["ARITHMETIC_MIN_VAL_ACCURACY", "FIGURES", "REASONING_GYM_DATASETS", "RECIPES"]


# (final train reward, val exact-sort) of every seed: the seeds' range here widened by about their spread,
# since another CPU or torch build changes a run as another seed would (set from runs on an Intel Xeon and an
# AMD EPYC machine, both one thread; gspo's upper and reinforce_pp's lower bound widened to hold the runs with the
# kernels pinned, which the suite makes: gspo seed 0 at 45.7%, reinforce_pp seed 2 at 6.213, 2026-11-28)
RECIPE_BANDS: dict[str, tuple[Band, Band]] = {
    "distill": (Band(6.55, 7.00), Band(0.45, 0.95)),
    "dapo": (Band(6.65, 7.00), Band(0.40, 0.80)),
    "dr_grpo": (Band(6.45, 6.75), Band(0.15, 0.45)),
    "gspo": (Band(6.40, 6.80), Band(0.15, 0.55)),
    "cispo": (Band(6.40, 6.70), Band(0.15, 0.35)),
    "sapo": (Band(6.45, 6.85), Band(0.15, 0.50)),
    "luspo": (Band(6.35, 6.75), Band(0.10, 0.42)),
    "vespo": (Band(6.45, 6.90), Band(0.15, 0.52)),
    "rloo": (Band(6.35, 6.60), Band(0.10, 0.25)),
    "ppo": (Band(6.15, 6.65), Band(0.10, 0.40)),
    "reinforce_pp": (Band(6.15, 6.60), Band(0.10, 0.30)),
    "reinforce_baseline": (Band(6.20, 6.55), Band(0.05, 0.20)),
    "grpo": (Band(6.10, 6.50), Band(0.10, 0.22)),
    "max_reward": (Band(5.60, 6.20), Band(0.03, 0.15)),
    "reinforce": (Band(4.90, 5.60), Band(0.00, 0.04)),
    # from one machine's three seeds (docs/compare_options.md, 2026-11-28), widened by their spread
    "gdpo": (Band(6.30, 7.00), Band(0.10, 1.00)),
    "high_entropy": (Band(6.25, 6.90), Band(0.10, 0.43)),
    "clip_cov": (Band(6.20, 6.85), Band(0.01, 0.43)),
    "passk": (Band(6.30, 6.70), Band(0.13, 0.34)),
    "kl_cov": (Band(6.15, 6.65), Band(0.03, 0.27)),
    "grpo_opsm": (Band(6.05, 6.55), Band(0.02, 0.29)),
    "grpo_k3_is": (Band(5.70, 6.75), Band(0.00, 0.40)),
    # from one machine's three seeds (docs/compare_sort.md, 2026-11-29: 6.57-6.63, 26.6-36.7%), widened as gspo's
    "gmpo": (Band(6.40, 6.85), Band(0.15, 0.55)),
    # the same (docs/compare_sort.md, 2026-11-29: 6.56-6.58, 23.4-29.3%; 6.42-6.58, 19.1-27.0%), widened as their
    # neighbours in the table
    "dppo": (Band(6.35, 6.80), Band(0.12, 0.45)),
    "reinforce_pp_baseline": (Band(6.15, 6.70), Band(0.08, 0.35)),
    # the same (docs/compare_sort.md, 2026-11-29: 6.60-6.76, 28.5-42.2%), widened as gspo's
    "otb": (Band(6.40, 6.95), Band(0.15, 0.60)),
    # the same (6.59-6.61, 25.0-25.8%), widened as dppo's
    "remax": (Band(6.35, 6.85), Band(0.12, 0.45)),
    # the same (6.25-6.49, 14.5-30.9%), widened as ppo's
    "vc_ppo": (Band(6.00, 6.70), Band(0.05, 0.45)),
    # from one machine's three seeds (docs/compare_sort.md, 2026-11-30: 6.62-6.77, 28.5-41.4%), widened as otb's
    "topr": (Band(6.40, 6.95), Band(0.15, 0.60)),
    # the same (6.43-6.51, 14.1-22.3%), widened as reinforce_pp_baseline's
    "gpg": (Band(6.15, 6.70), Band(0.08, 0.35)),
    # the same (6.49-6.60, 20.3-26.6%), widened as dppo's
    "lite_ppo": (Band(6.25, 6.80), Band(0.10, 0.40)),
    # the same (2026-11-30: 6.47-6.79, 16.4-38.3%) and this suite's AVX2-pinned runs (6.25-6.72, 5.5-44.1%): the
    # widest spread of the table, as dapo's
    "gppo": (Band(6.05, 6.95), Band(0.03, 0.60)),
    # the same (4.87-5.88, 0.4-6.3%): the policy's lambda is 0 on 4-token responses (docs/benchmarks.md)
    "vapo": (Band(4.40, 6.30), Band(0.00, 0.15)),
    # from one machine's three seeds (docs/compare_sort.md, 2026-11-30: 6.53-6.67, 21.5-37.9%), widened as
    # high_entropy's
    "entropy_advantage": (Band(6.25, 6.90), Band(0.10, 0.50)),
    # the same (6.70-6.88, 43.0-57.0%), dapo's band: the recipe is dapo's with another baseline
    "qae": (Band(6.50, 7.00), Band(0.30, 0.80)),
    # from one machine's three seeds (AVX2-pinned, 2026-12-01: 5.87-6.06, 6.6-9.4%), widened by about their spread
    "mapo": (Band(5.55, 6.40), Band(0.02, 0.22)),
    # the same (6.40-6.63, 16.8-38.7%), widened as gppo's
    "asymre": (Band(6.15, 6.90), Band(0.05, 0.55)),
    # the same (2.70-3.23, 0%): no exact sort early, so every advantage is -1 and the policy stays at its start
    # (docs/benchmarks.md)
    "w_reinforce": (Band(2.30, 3.70), Band(0.00, 0.02)),
    # from one machine's three seeds (2026-11-30: 6.60-6.86, 37.1-61.3%; AVX2-pinned 6.58-6.89, 28.1-68.0%), dapo's
    # band widened below as gppo's: the recipe is dapo's with PPO's clip and an entropy bonus
    "adaptive_entropy": (Band(6.05, 7.00), Band(0.03, 0.80)),
    # from one machine's three seeds (2026-11-30: 5.78-6.05, 6.6-9.4%; AVX2-pinned 5.85-5.98, 5.5-9.0%), widened
    # as vapo's: one response per prompt and a loss anchored to the reference learn the exact sort slowly here
    # (docs/benchmarks.md)
    "astar_po": (Band(5.30, 6.50), Band(0.01, 0.25)),
    # from one machine's three seeds (2026-11-30: 6.37-6.55, 10.9-18.4%; AVX2-pinned 6.46-6.48, 17.2-18.4%), widened
    # by about their spread
    "scalerl": (Band(6.15, 6.80), Band(0.05, 0.35)),
    # from one machine's three seeds (2026-11-30: 6.06-6.25, 10.2-14.1%; AVX2-pinned 5.91-6.19, 9.4-19.9%), widened
    # by about their spread
    "grpo_2": (Band(5.60, 6.60), Band(0.03, 0.35)),
    # from one machine's three seeds (AVX2-pinned, 2026-11-30: 5.79-6.14, 9.0-13.3%), widened by about their spread
    "grpo_replay": (Band(5.45, 6.50), Band(0.04, 0.20)),
    # from one machine's three seeds (AVX2-pinned, 2026-11-30: 6.91-6.94, 78.5-91.8%), widened as distill's
    "distill_iw_opd": (Band(6.70, 7.00), Band(0.60, 1.00)),
    # from one machine's three seeds (AVX2-pinned, 2026-11-30: 6.97-6.97, 90.6-96.5%), widened as distill's
    "distill_topk": (Band(6.80, 7.00), Band(0.75, 1.00)),
    # from one machine's three seeds (2026-12-01: 6.72-6.94, 34.8-69.1%; AVX2-pinned 6.76-6.95, 44.5-68.4%), widened
    # as dapo's: a demonstration in each group gives the widest spread of val exact-sort
    "luffy": (Band(6.50, 7.00), Band(0.20, 0.85)),
    # the same (6.56-6.65, 24.2-28.9%; AVX2-pinned 6.50-6.67, 18.0-35.5%), widened by about their spread
    "m2po": (Band(6.30, 6.85), Band(0.08, 0.50)),
    # the same (6.26-6.49, 18.4-25.8%; AVX2-pinned 6.23-6.40, 15.2-22.7%), widened by about their spread
    "pods": (Band(6.00, 6.70), Band(0.05, 0.40)),
    # from one machine's three seeds (2026-12-01: 6.56-6.63, 23.8-32.4%; AVX2-pinned 6.51-6.71, 21.5-40.2%), widened
    # by about their spread as m2po's
    "dcpo": (Band(6.30, 6.85), Band(0.10, 0.50)),
    # from one machine's three seeds (2026-12-01: 6.61-6.80, 30.5-46.9%; AVX2-pinned 6.54-6.84, 27.3-55.5%), widened
    # by about their spread
    "spo": (Band(6.35, 6.95), Band(0.15, 0.65)),
    # from one machine's three seeds (2026-12-01: 6.55-6.62, 20.7-26.2%; AVX2-pinned 6.33-6.55, 17.6-21.5%), widened
    # by about their spread
    "bapo": (Band(6.10, 6.85), Band(0.06, 0.45)),
    # from one machine's three seeds (2026-12-01: 6.46-6.68, 16.8-36.3%; AVX2-pinned 6.44-6.72, 17.6-39.1%), widened
    # by about their spread
    "gvpo": (Band(6.10, 6.90), Band(0.05, 0.60)),
    # from one machine's three seeds (2026-12-01: 6.51-6.62, 17.6-25.8%; AVX2-pinned 6.51-6.61, 19.1-27.3%), widened by
    # about their spread
    "archer": (Band(6.20, 6.90), Band(0.05, 0.50)),
    # from one machine's three seeds (2026-12-01: 6.28-6.76, 14.1-48.8%; AVX2-pinned 6.43-6.73, 19.5-40.2%), widened
    # by about their spread
    "aspo": (Band(6.00, 6.95), Band(0.02, 0.70)),
    # from one machine's three seeds (2026-12-01: 5.53-5.70, 12.1-21.9%; AVX2-pinned 5.58-5.64, 10.5-21.9%), widened
    # by about their spread; its train reward is the shaped one (the task reward less the unlikeliness penalty)
    "unlikeliness": (Band(5.35, 5.90), Band(0.05, 0.40)),
    # from one machine's three seeds (2026-12-01: 6.85-6.94, 60.2-68.4%; AVX2-pinned 6.77-6.87, 55.1-57.4%), dapo's
    # band widened by about their spread
    "prorl": (Band(6.55, 7.00), Band(0.35, 0.85)),
    # from one machine's three seeds (Intel Xeon, 2026-12-01: 6.40-6.65, 13.3-36.3%; AVX2-pinned 6.36-6.64,
    # 12.5-30.9%), widened by about their spread
    "flowrl": (Band(6.05, 6.90), Band(0.04, 0.60)),
    # from one machine's three seeds (Intel Xeon, AVX2-pinned, 2026-12-01: 6.55-6.71, 23.4-40.2%), widened by about
    # their spread
    "simko": (Band(6.25, 6.95), Band(0.08, 0.65)),
}
RECIPES = tuple(RECIPE_BANDS)  # configs/recipes/NAME.yaml, each over the seeds


def sort_figures() -> list[Figure]:
    figures = [
        Figure(
            "sort_lecture",
            "docs/benchmarks.md: The sort task",
            (rlvr_fit("configs/sort_lecture.yaml"),),
            toy_metrics(reward=Band(5.0, 6.5), accuracy=Band(0.01, 0.12)),
            quick=True,
            curves=(Curve("sort_lecture", CSV_LOG),),
        ),
        Figure(
            "sort_grpo",
            "docs/benchmarks.md: The sort task",
            (rlvr_fit("configs/sort_grpo.yaml"),),
            # val exact-sort seen from 47.7% (seed 1 pinned on an Intel Xeon, 2026-12-01, and unpinned with AVX-512
            # kernels on an AMD EPYC) to 78.5%
            toy_metrics(reward=Band(6.7, 7.0), accuracy=Band(0.40, 0.85)),
            quick=True,
            curves=(Curve("sort_grpo", CSV_LOG),),
        ),
    ]
    for recipe in RECIPES:
        reward, accuracy = RECIPE_BANDS[recipe]
        figures.append(
            Figure(
                f"recipe_{recipe}",
                "docs/benchmarks.md: Algorithm recipes on the sort task (docs/compare_sort.md)",
                (rlvr_fit(f"configs/recipes/{recipe}.yaml"),),
                toy_metrics(reward=reward, accuracy=accuracy),
                quick=True,
                curves=(Curve(recipe, CSV_LOG),),
            )
        )
    stage = "logs/{stage}/seed_{seed}/metrics.csv"
    grpo, scratch, ei = (stage.replace("{stage}", name) for name in ("grpo", "grpo_scratch", "ei"))
    figures.append(
        Figure(
            "sft_then_grpo",
            "docs/benchmarks.md: SFT, then RL or expert iteration",
            (Command(("{python}", "{repo}/scripts/sft_then_grpo.py", "--seed", "{seed}", "--workdir", "{run_dir}")),),
            (
                Metric(
                    "sft",
                    csv_final(stage.replace("{stage}", "sft"), "val/accuracy"),
                    Band(0.25, 0.38),
                    "last val/accuracy of the SFT stage",
                    percent=True,
                ),
                Metric(
                    "grpo_from_sft",
                    csv_final(grpo, "val/accuracy"),
                    Band(0.55, 0.75),  # pinned kernels, 2026-11-28: 58.2%, 70.3%, 60.5% (Intel records: 66-62%)
                    "last val/accuracy of GRPO from the SFT checkpoint",
                    percent=True,
                ),
                Metric(
                    "grpo_from_scratch",
                    csv_final(scratch, "val/accuracy"),
                    Band(0.10, 0.22),
                    "last val/accuracy of GRPO from a random policy",
                    percent=True,
                ),
                Metric(
                    "sft_gain_for_grpo",
                    difference(csv_final(grpo, "val/accuracy"), csv_final(scratch, "val/accuracy")),
                    Band(0.40),
                    "GRPO from SFT minus GRPO from scratch, same seed",
                    percent=True,
                ),
                Metric(
                    "ei_round_1",
                    csv_nth(ei, "val/accuracy", 0),
                    Band(0.30, 0.50),
                    "val/accuracy after expert-iteration round 1",
                    percent=True,
                ),
                Metric(
                    "ei_round_3",
                    csv_final(ei, "val/accuracy"),
                    Band(0.50, 0.68),
                    "val/accuracy after expert-iteration round 3",
                    percent=True,
                ),
                Metric(
                    "ei_gain",
                    difference(csv_final(ei, "val/accuracy"), csv_nth(ei, "val/accuracy", 0)),
                    Band(0.10),
                    "expert iteration's round 3 minus round 1, same seed",
                    percent=True,
                ),
            ),
            quick=True,
            curves=(Curve("GRPO from SFT", grpo), Curve("GRPO from scratch", scratch)),
        )
    )
    return figures


def stale_data_figure() -> Figure:
    """GVPO and Dr. GRPO with each response trained on 4 times (16 updates a rollout): GVPO's log-ratio term holds
    where PPO's clip does not, on every seed (docs/gvpo_sort.md)."""
    four = "--model.init_args.update.epochs=4"
    runs = {name: f"{name}/version_0/metrics.csv" for name in ("gvpo", "dr_grpo")}
    commands = tuple(rlvr_fit(f"configs/recipes/{name}.yaml", four, log_name=name) for name in runs)
    final = {name: csv_final(path, "val/accuracy") for name, path in runs.items()}
    return Figure(
        "gvpo_stale",
        "docs/benchmarks.md: GVPO on the sort task (docs/gvpo_sort.md)",
        commands,
        (
            # 2026-12-01: 42.2, 40.2, 31.6% and 11.7, 10.9, 5.5% (AVX2-pinned: 41.4, 37.5, 46.1% and 15.6, 13.3, 14.8%)
            Metric("gvpo", final["gvpo"], Band(0.20, 0.60), "GVPO, 4 epochs: last val/accuracy", percent=True),
            Metric("dr_grpo", final["dr_grpo"], Band(0.0, 0.22), "Dr. GRPO, 4 epochs: last val/accuracy", percent=True),
            Metric(
                "gvpo_gain",
                difference(final["gvpo"], final["dr_grpo"]),
                Band(0.10),
                "GVPO minus Dr. GRPO, 4 epochs each, same seed",
                percent=True,
            ),
        ),
        quick=True,
        curves=tuple(Curve(name, path) for name, path in runs.items()),
    )


def curriculum_figure(name: str, bench_args: tuple[str, ...], no_filter: Band, filter_: Band, gain: Band) -> Figure:
    """scripts/bench_curriculum.py: configs/sort_curriculum.yaml with and without the difficulty filter, same seed."""
    command = Command(
        (
            "{python}",
            "{repo}/scripts/bench_curriculum.py",
            "--seeds",
            "{seed}",
            "--out",
            "{run_dir}/results.json",
            *bench_args,
        )
    )
    plain, filtered = (json_value("results.json", label, "0", "val_accuracy") for label in ("no filter", "filter"))
    return Figure(
        name,
        "docs/benchmarks.md: Curriculum (difficulty filter)",
        (command,),
        (
            Metric("no_filter", plain, no_filter, "val exact-sort without the filter (results.json)", percent=True),
            Metric("filter", filtered, filter_, "val exact-sort with the filter (results.json)", percent=True),
            Metric(
                "filter_gain",
                difference(filtered, plain),
                gain,
                "with the filter minus without, same seed",
                percent=True,
            ),
        ),
    )


FIGURES: tuple[Figure, ...] = (
    *sort_figures(),
    length_bias_figure(),
    gfpo_figure(),
    stale_data_figure(),
    Figure(
        "sort_ddp",
        "docs/benchmarks.md: Multi-process training",
        (rlvr_fit("configs/sort_ddp.yaml"),),
        toy_metrics(reward=Band(6.7, 7.0), accuracy=Band(0.45, 0.80)),
        curves=(Curve("sort_ddp", CSV_LOG),),
    ),
    # the curriculum bands hold seeds 0-2 on an Intel Xeon (2026-11-25) and an AMD EPYC (2026-12-02); min_kept and
    # fail_all have no consistent effect (gains of either sign over seeds 0-7), so their gains are banded both ways
    curriculum_figure("curriculum", (), Band(0.18, 0.38), Band(0.18, 0.50), Band(-0.05)),
    curriculum_figure(
        "curriculum_min_kept", ("--filter-arg", "min_kept=32"), Band(0.18, 0.38), Band(0.05, 0.50), Band(-0.20, 0.15)
    ),
    curriculum_figure(
        "curriculum_fail_all", ("--mode", "fail_all"), Band(0.18, 0.38), Band(0.15, 0.28), Band(-0.15, 0.15)
    ),
    *language_model_figures(),
)
