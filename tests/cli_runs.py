"""`rlvr` run in-process for the tests of its error messages: the configs they start from and `run`."""

from pathlib import Path

from rlvr_lightning.cli.app import entry_point

ROOT = Path(__file__).resolve().parents[1]
SORT = str(ROOT / "configs" / "sort_grpo.yaml")
TINY_LM = str(ROOT / "configs" / "length_bias" / "grpo.yaml")  # a random 2-layer Llama and a local tokenizer
QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false"]


def run(capsys, *args: str) -> tuple[int, list[str]]:
    """`rlvr ARGS`' exit status and the non-blank lines it wrote to stderr (no traceback, no usage text)."""
    code = entry_point(list(args))
    err = capsys.readouterr().err
    assert "usage:" not in err and "Traceback" not in err and "Namespace(" not in err, err
    return code, [line for line in err.splitlines() if line.strip()]
