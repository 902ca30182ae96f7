"""A model validated before it trains, in one process (`trainer.validate`, then `trainer.fit`: a baseline measured
first, in a script or a notebook). Lightning's `validate` runs in `torch.inference_mode` (validation inside `fit`
does not), so what the sampler builds there, a bf16 sampling copy or a static-decoding workspace, must still be
updated in place by the training that follows."""

from __future__ import annotations

import pytest
import torch

from rlvr_lightning.cli import main

from .test_cli import CONFIG_DIR

BACKENDS = {
    "eager loop, bf16 copy": "rlvr_lightning.generation.KVCacheGeneration",
    "static, bf16 copy": "rlvr_lightning.generation.StaticCacheGeneration",
}


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_model_validated_first_then_trains(in_tmp_dir, monkeypatch, backend):
    generation = "--model.init_args.policy.init_args.generation.backend"
    cli = main(
        [
            "--config",
            str(CONFIG_DIR / "length_bias" / "grpo.yaml"),
            f"--model.init_args.policy.init_args.model.tokenizer={CONFIG_DIR / 'length_bias' / 'digits_tokenizer'}",
            f"{generation}={BACKENDS[backend]}",
            f"{generation}.init_args.dtype=bfloat16",  # a cast copy samples; the fp32 weights train
            "--data.init_args.batch_size=8",
            "--data.init_args.val_batch_size=8",
            "--model.init_args.validation.group_size=8",  # validation's rows fill training's bucket (64)
            "--model.init_args.validation.greedy=false",
            "--model.init_args.update.mini_batch_size=32",
            "--trainer.limit_train_batches=3",
            "--trainer.limit_val_batches=1",
            "--trainer.val_check_interval=null",
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
            "--trainer.enable_progress_bar=false",
        ],
        run=False,
    )
    seen = []
    generate = type(cli.model.policy.generation).generate

    def recording(self, *args, **kwargs):
        seen.append(torch.is_inference_mode_enabled())
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(type(cli.model.policy.generation), "generate", recording)
    cli.trainer.validate(cli.model, datamodule=cli.datamodule)
    assert seen == [True]  # the copy (and the workspace) were built in inference mode
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step > 0 and seen[1:] and not any(seen[1:])
    policy = cli.model.policy
    cast = policy.generation._weights.model_for(policy.model, torch.bfloat16)
    for (name, copied), parameter in zip(cast.named_parameters(), policy.model.parameters(), strict=True):
        assert torch.equal(copied, parameter.detach().to(torch.bfloat16)), name  # refreshed after the last update
