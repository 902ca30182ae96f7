"""What `rlvr` prints for a mistaken distillation option: the option, its value and its domain, before a model
loads (tests/test_cli_errors.py's conventions)."""

import pytest

from .cli_runs import TINY_LM, run
from .test_cli_errors import CONFIGS


def test_a_negative_distillation_position_weight_is_refused_by_name(in_tmp_dir, capsys):
    recipe = str(CONFIGS / "recipes" / "distill.yaml")
    code, lines = run(capsys, "fit", "--config", recipe, "--model.init_args.distillation.position_weight_gamma=-0.5")
    assert code == 2
    assert lines[0] == "error: distillation.position_weight_gamma=-0.5 is not valid: must be a finite number >= 0"
    assert lines[1] == (
        "  at model.init_args.distillation.position_weight_gamma "
        "(command line: --model.init_args.distillation.position_weight_gamma=-0.5)"
    )


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("weights", "newest", "error: weights='newest' is not valid; choose one of ['live', 'ema', 'base']"),
        (
            "reprompt_template",
            "{prompt}",
            "error: reprompt_template='{prompt}' is not valid: must be a string containing {prompt} and {solution} "
            "(or null)",
        ),
        (
            "solution_template",
            "plain",
            "error: solution_template='plain' is not valid: must be a string containing {successful_previous_attempt} "
            "or {privileged_context} (or null)",
        ),
        ("demonstrations", "dataset", "error: demonstrations='dataset' is not valid; choose one of ['group', 'data']"),
    ],
)
def test_a_self_teacher_option_out_of_its_domain_stops_the_run_before_a_model_loads(capsys, option, value, message):
    teacher = "--model.init_args.teacher=rlvr_lightning.modules.SelfTeacher"
    code, lines = run(
        capsys, "fit", "--config", TINY_LM, teacher, f"--model.init_args.teacher.init_args.{option}={value}"
    )
    assert code == 2
    assert lines[0] == message
    assert lines[1].startswith(f"  at model.init_args.teacher.init_args.{option} (command line: ")
