"""SDFT (`SelfTeacher(demonstrations="data")`): the teacher is the policy shown each row's own demonstration from
the data (TRL's SDFT teacher prompt), every row is taught, no reward is read; a row without the field and a
template without the data placeholder are refused; `rlvr fit` runs it with logit-level distillation and resumes
bitwise."""

from __future__ import annotations

import shutil

import pytest
import torch
import yaml
from torch.testing import assert_close

from rlvr_lightning.cli.app import main
from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer
from rlvr_lightning.generation.loop import left_pad
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules import SelfTeacher
from tests.test_resume import logged, parameters
from tests.test_self_distillation_fit import config as sdpo_config

from .test_self_distillation import PROMPTS, policy_of, tokenizer_dir, whole  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")
SOLUTIONS = ["2 + 3 = 5", "ab"]


def sampled(policy):
    torch.manual_seed(1)
    batch = {"prompt": PROMPTS, "metadata": [{"solution": text, "answer": "x"} for text in SOLUTIONS]}
    return policy.sample(batch, 2, SamplingConfig(max_new_tokens=5))


def test_the_teacher_is_shown_each_row_s_own_demonstration_in_trls_sdft_prompt(tokenizer_dir):  # noqa: F811
    policy = policy_of(tokenizer_dir)
    rollout = sampled(policy)
    assert rollout.reward is None  # SDFT reads no reward
    teacher = SelfTeacher(weights="live", demonstrations="data").bind(policy)
    # TRL's teacher_prompt_template "{prompt}\n\n{privileged_context}"; a chat prompt's last user message re-written
    assert teacher.reprompt("What is 2+3?", SOLUTIONS[0]) == "What is 2+3?\n\n2 + 3 = 5"
    assert teacher.reprompt(PROMPTS[1], "ab") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say ab.\n\nab"},
    ]
    teacher.score(rollout, whole, 1.0)
    assert rollout.teacher_rows.tolist() == [True] * 4

    texts = [
        "<|user|>What is 2+3?\n\n2 + 3 = 5<|endoftext|><|assistant|>",
        "<|system|>Be brief.<|endoftext|><|user|>Say ab.\n\nab<|endoftext|><|assistant|>",
    ]
    by_hand = rollout.select(torch.arange(4))
    ids = [policy.tokenizer(texts[row // 2], add_special_tokens=False)["input_ids"] for row in range(4)]
    by_hand.prompt_ids, by_hand.prompt_mask = left_pad(ids, policy.pad_token_id)
    by_hand.group_index, by_hand.group_size = torch.arange(4), 1
    expected, _ = policy.token_log_probs(by_hand)
    mask = rollout.response_mask.bool()
    assert_close(rollout.teacher_log_probs[mask], expected.detach()[mask], rtol=1e-5, atol=1e-6)


def test_a_row_without_the_field_and_a_template_without_the_data_placeholder_are_refused(tokenizer_dir):  # noqa: F811
    policy = policy_of(tokenizer_dir)
    rollout = sampled(policy)
    teacher = SelfTeacher(weights="live", demonstrations="data", demonstration_key="privileged_context").bind(policy)
    with pytest.raises(ValueError, match=r"metadata\['privileged_context'\], and row 0 has none \(its fields: answer"):
        teacher.score(rollout, whole, 1.0)
    with pytest.raises(ValueError, match=r"with teacher.demonstrations=data, and has no \{privileged_context\}"):
        SelfTeacher(demonstrations="data", solution_template="{successful_previous_attempt}").bind(policy)
    empty = sampled(policy)
    for row in empty.metadata[:2]:
        row["solution"] = "  "
    SelfTeacher(weights="live", demonstrations="data").bind(policy).score(empty, whole, 1.0)
    assert empty.teacher_rows.tolist() == [False, False, True, True]  # an empty demonstration teaches nothing


EXAMPLES = [
    {"prompt": "What is 2+3?", "solution": "2 + 3 = 5"},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say ab."}], "solution": "ab"},
]


def sdft_config(tmp_path, name, tokenizer):
    path = sdpo_config(tmp_path, name, tokenizer)
    values = yaml.safe_load(path.read_text())
    model = values["model"]["init_args"]
    model["teacher"]["init_args"] = {"weights": "base", "demonstrations": "data"}
    model["distillation"] = {"coef": 1.0, "rl_coef": 0.0, "mode": "topk_logits", "topk": 8, "alpha": 0.5}
    values["data"]["init_args"]["task"]["init_args"]["examples"] = EXAMPLES
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def test_sdft_through_rlvr_fit_teaches_every_row_and_resumes_bitwise(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tokenizer = save_tiny_tokenizer(tmp_path / "tokenizer")
    full = main(["fit", "--config", str(sdft_config(tmp_path, "full", tokenizer))])
    assert set(logged(tmp_path, "full", "train/taught_rows").values()) == {"1.0"}
    assert all(float(value) != 0 for value in logged(tmp_path, "full", "train/teacher_kl").values())

    (tmp_path / "ckpt_resumed").mkdir()
    shutil.copy(tmp_path / "ckpt_full" / "epoch=0-rollout_step=2.ckpt", tmp_path / "ckpt_resumed" / "last.ckpt")
    resumed = main(["fit", "--config", str(sdft_config(tmp_path, "resumed", tokenizer)), "--ckpt_path", "last"])
    expected, actual = parameters(full.model), parameters(resumed.model)
    assert expected.keys() == actual.keys() and any(key.startswith("teacher.copy.") for key in expected)
    for key in expected:
        assert torch.equal(expected[key], actual[key]), key


def test_base_over_a_warm_started_adapter_is_the_first_weights_not_the_model_before_the_warm_up(tokenizer_dir):  # noqa: F811
    """A LoRA adapter loaded trained (a warm-up's): `base` keeps a whole copy of the policy as it starts, since the
    model with its adapter disabled is the model before the warm-up; a fresh adapter needs no copy."""
    from rlvr_lightning.policies.hf_options import LoRAOptions
    from rlvr_lightning.policies.lora_reference import AdapterReference

    policy = policy_of(tokenizer_dir, lora=LoRAOptions(r=2, alpha=4))
    assert isinstance(SelfTeacher(weights="base").bind(policy).copy, AdapterReference)  # fresh: disabling is exact
    with torch.no_grad():  # the warm start
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)
    teacher = SelfTeacher(weights="base", demonstrations="data").bind(policy)
    assert not isinstance(teacher.copy, AdapterReference)
    rollout = sampled(policy)
    with torch.no_grad():
        first, _ = policy.token_log_probs(
            teacher.reprompted(rollout, [*SOLUTIONS[:1] * 2, *SOLUTIONS[1:] * 2], [None] * 4)
        )
        for name, p in policy.named_parameters():  # training moves the policy, not the teacher
            if "lora_" in name:
                p.add_(0.3)
    teacher.score(rollout, whole, 1.0)
    mask = rollout.response_mask.bool()
    assert_close(rollout.teacher_log_probs[mask], first[mask], rtol=1e-5, atol=1e-6)
