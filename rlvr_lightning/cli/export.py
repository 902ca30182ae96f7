"""`rlvr export`: a training checkpoint as a plain Hugging Face directory (LoRA merged).

    rlvr export --config configs/my_run.yaml --ckpt_path runs/my_run/checkpoints/last.ckpt --output_dir exported/

The run's config (the same `--config` files, and `--model.*` overrides, as `rlvr fit`) rebuilds the
module; only its `model` section is used. The checkpoint is either a `.ckpt` file (single process,
DDP, or `FSDP2Strategy(save_distributed_checkpoint=false)`) or the directory of per-rank shards that
a sharded (FSDP2) run writes; it is read in this one process, whatever the world size that wrote it.
The policy then writes itself with `save_pretrained` (weights, config and tokenizer; a LoRA adapter
is merged into the base weights unless `--merge_lora false`), so that
`AutoModelForCausalLM.from_pretrained(output_dir)` loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from torch import nn

from rlvr_lightning.runtime.checkpoint_files import load_checkpoint_weights


def check_export(module: nn.Module, output_dir: str | Path, overwrite: bool = False) -> None:
    """Raise when `module.policy` cannot be written as a Hugging Face directory or `output_dir` is taken."""
    policy = getattr(module, "policy", None)
    if policy is None or not hasattr(policy, "save_pretrained"):
        raise TypeError(
            f"rlvr export writes a Hugging Face directory; the module's policy is {type(policy).__name__}, "
            "which has no save_pretrained (only language-model policies such as HFPolicy can be exported)"
        )
    output = Path(output_dir)
    if output.exists() and (not output.is_dir() or any(output.iterdir())) and not overwrite:
        raise FileExistsError(f"--output_dir {output} exists and is not empty; choose another or pass --overwrite true")


def export_policy(module: nn.Module, output_dir: str | Path, merge_lora: bool = True, overwrite: bool = False) -> Path:
    """Write `module.policy` as a Hugging Face directory."""
    check_export(module, output_dir, overwrite)
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    module.policy.save_pretrained(output, merge_lora=merge_lora)
    return output


def export_parser(exit_on_error: bool = True):
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(prog="rlvr export", description=__doc__.split("\n\n")[0], exit_on_error=exit_on_error)
    parser.add_argument("--config", action=ActionConfigFile, help="the run's config file(s), as given to rlvr fit")
    parser.add_subclass_arguments(pl.LightningModule, "model", required=True, help="the module (from the config)")
    parser.add_argument("--ckpt_path", type=str, required=True, help="a .ckpt file or a sharded checkpoint directory")
    parser.add_argument("--output_dir", type=str, required=True, help="where the Hugging Face directory is written")
    parser.add_argument("--merge_lora", type=bool, default=True, help="merge a LoRA adapter into the base weights")
    parser.add_argument("--overwrite", type=bool, default=False, help="write into a non-empty output_dir")
    # the rest of a run's config (as rlvr fit writes it to config.yaml) is read and ignored
    for section in (
        "trainer",
        "data",
        "seed_everything",
        "torch_threads",
        "run_name",
        "optimizer",
        "lr_scheduler",
        "weights_only",
    ):
        parser.add_argument(f"--{section}", type=Any, default=None, help="(read from the config, not used)")
    return parser


def main(args: list[str] | None = None, exit_on_error: bool = True) -> Path:
    """`rlvr export ARGS`; a parse error exits (status 2), or with `exit_on_error=False` raises `ArgumentError`."""
    parser = export_parser(exit_on_error)
    config = parser.parse_args(args)
    module = parser.instantiate_classes(config).model
    check_export(module, config.output_dir, config.overwrite)  # before the checkpoint is read
    kind = load_checkpoint_weights(module, config.ckpt_path)
    output = export_policy(module, config.output_dir, merge_lora=config.merge_lora, overwrite=config.overwrite)
    count = sum(p.numel() for p in module.policy.parameters())
    policy = type(module.policy).__name__
    print(f"rlvr export: {kind} checkpoint {config.ckpt_path} -> {output} ({policy}, {count:,} parameters)")
    return output


if __name__ == "__main__":  # python -m rlvr_lightning.cli.export ... (the same as rlvr export ...)
    main()
