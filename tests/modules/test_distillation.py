"""On-policy distillation in `RLVRModule` (modules/distillation.py): the loss the update back-propagates, its
mix with the reward objective, teacher = student, the tokenizer check, and placement."""

import copy
import math

import pytest
import torch
from torch.testing import assert_close

from rlvr_lightning.core.losses.policy_losses import PPOClip
from rlvr_lightning.generation.sampling_config import SamplingConfig
from rlvr_lightning.modules import RLVRModule
from rlvr_lightning.modules.distillation import DistillationConfig, Teacher
from rlvr_lightning.modules.options import AggregationConfig, ImportanceSamplingConfig, KLConfig, UpdateConfig
from rlvr_lightning.modules.update.normalisers import MiniBatchSizes
from rlvr_lightning.modules.update.policy_update import PolicyUpdate
from rlvr_lightning.policies.hf_options import HFModelOptions, LoRAOptions
from rlvr_lightning.policies.sort_teacher import SortTeacher
from rlvr_lightning.policies.toy_sort import ToySortPolicy
from rlvr_lightning.rewards import SortInclusionOrderingReward

from .test_rlvr_module import fit

V, L = 5, 3  # vocabulary, prompt (= response) length


def student(seed: int = 0, embedding_dim: int = 4) -> ToySortPolicy:
    torch.manual_seed(seed)
    return ToySortPolicy(vocab_size=V, prompt_length=L, embedding_dim=embedding_dim, activation="tanh")


def rollout_of(policy, seed: int = 1):
    torch.manual_seed(seed)
    prompts = [torch.randperm(V)[:L].tolist() for _ in range(3)]
    rollout = policy.sample({"prompt": prompts, "metadata": [{}] * 3}, 4, SamplingConfig())
    rollout.advantages = torch.randn(rollout.num_rows)
    return rollout


def update_of(policy, teacher=None, loss=None, epochs=1, **distillation):
    return PolicyUpdate(
        policy,
        loss or PPOClip(),
        AggregationConfig(mode="token-mean"),
        KLConfig(),
        None,
        ImportanceSamplingConfig(),
        UpdateConfig(epochs=epochs),
        0.0,
        SamplingConfig(),
        teacher=None if teacher is None else Teacher(teacher, policy),
        distillation=DistillationConfig(**distillation),
    )


def loss_and_grads(update, rollout):
    update.policy.zero_grad(set_to_none=True)
    update.add_old_and_reference_log_probs(rollout)
    sizes = MiniBatchSizes(rollout.num_rows, rollout.response_mask.numel())
    part = update.micro_batch_loss(rollout, None, sizes, True, True)
    part.loss.backward()
    return part, [p.grad.clone() for p in update.policy.parameters()]


def test_the_update_back_propagates_the_hand_computed_reverse_kl_to_the_scripted_teacher():
    policy = student()
    rollout = rollout_of(policy)
    sampled = rollout.old_log_probs  # ToySortPolicy records them while sampling; one update does not need them
    part, _ = loss_and_grads(update_of(policy, SortTeacher(V, L, confidence=0.8), rl_coef=0.0), rollout)
    # SortTeacher: log 0.8 on the sorted prompt's token at each position, log(0.2 / 4) elsewhere
    expected = []
    for row in range(rollout.num_rows):
        target = sorted(rollout.prompt_ids[row].tolist())
        for t, token in enumerate(rollout.response_ids[row].tolist()):
            teacher = math.log(0.8) if token == target[t] else math.log(0.05)
            expected.append(sampled[row, t].item() - teacher)
    # the first update: ratio 1, so the loss is the token mean of log pi - log pi_teacher
    assert_close(part.loss.item(), sum(expected) / len(expected), rtol=1e-6, atol=1e-6)
    assert_close(part.teacher_kl[0].flatten(), torch.tensor(expected), rtol=1e-5, atol=1e-6)


def test_position_weight_gamma_reaches_the_update_as_iw_opd_weights():
    policy = student()
    rollout = rollout_of(policy)
    sampled = rollout.old_log_probs
    update = update_of(policy, SortTeacher(V, L, confidence=0.8), rl_coef=0.0, position_weight_gamma=0.5)
    part, _ = loss_and_grads(update, rollout)
    expected = []
    for row in range(rollout.num_rows):
        target = sorted(rollout.prompt_ids[row].tolist())
        drift = [  # log pi_teacher - log pi_rollout of each response token
            (math.log(0.8) if token == target[t] else math.log(0.05)) - sampled[row, t].item()
            for t, token in enumerate(rollout.response_ids[row].tolist())
        ]
        total = sum(abs(d) for d in drift)
        for t, d in enumerate(drift):
            # w_t = 1 + gamma (1 - sum_{s<t} |d_s| / sum_s |d_s|)  (arXiv 2606.22600, IW-OPD), l_t = -w_t d_t
            expected.append(-(1 + 0.5 * (1 - sum(abs(e) for e in drift[:t]) / total)) * d)
    assert_close(part.loss.item(), sum(expected) / len(expected), rtol=1e-6, atol=1e-6)


def test_the_mixed_objective_is_the_weighted_sum_of_its_parts():
    policy = student()
    rollout = rollout_of(policy)  # sampled before the policy moves: old log-probs differ, the clip is active
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.3 * torch.randn_like(p))
    teacher = student(seed=7)
    rl, rl_grads = loss_and_grads(update_of(policy, epochs=2), copy.copy(rollout))
    assert rl.policy_loss.stats["clip_frac_low"] + rl.policy_loss.stats["clip_frac_high"] > 0
    distill, distill_grads = loss_and_grads(update_of(policy, teacher, epochs=2, rl_coef=0.0), copy.copy(rollout))
    mixed, mixed_grads = loss_and_grads(update_of(policy, teacher, epochs=2, coef=0.7, rl_coef=0.3), copy.copy(rollout))
    assert distill.loss.abs() > 0.1 and rl.loss.abs() > 0.01
    assert_close(mixed.loss, 0.3 * rl.loss + 0.7 * distill.loss)
    for mixed_grad, rl_grad, distill_grad in zip(mixed_grads, rl_grads, distill_grads, strict=True):
        assert_close(mixed_grad, 0.3 * rl_grad + 0.7 * distill_grad)


def test_a_teacher_equal_to_the_student_gives_zero_loss_and_zero_gradient():
    policy = student()
    rollout = rollout_of(policy)
    part, grads = loss_and_grads(update_of(policy, copy.deepcopy(policy), rl_coef=0.0), rollout)
    assert part.loss.item() == 0 and torch.count_nonzero(part.teacher_kl[0]) == 0
    assert all(torch.count_nonzero(grad) == 0 for grad in grads)


def test_training_with_a_teacher_equal_to_the_student_leaves_the_student_where_it_is(in_tmp_dir):
    policy = student()
    before = copy.deepcopy(policy.state_dict())
    module = RLVRModule(
        policy,
        group_size=4,
        teacher=copy.deepcopy(policy),
        distillation=DistillationConfig(rl_coef=0.0),
        update=UpdateConfig(epochs=2, mini_batch_size=8),
    )
    trainer, recorder = fit(module, [SortInclusionOrderingReward()], steps=3)
    assert trainer.global_step == 3 * 2 * 2
    assert all(step["train/teacher_kl"] == 0 for step in recorder.steps)
    assert all(torch.equal(before[key], value) for key, value in policy.state_dict().items())


def test_distillation_learns_from_the_scripted_teacher_and_the_teacher_stays_out_of_the_checkpoint(in_tmp_dir):
    module = RLVRModule(
        student(embedding_dim=16),
        optimizer=lambda params: torch.optim.Adam(params, lr=0.03),
        group_size=4,
        teacher=SortTeacher(V, L),
        distillation=DistillationConfig(rl_coef=0.0),
    )
    trainer, recorder = fit(module, [SortInclusionOrderingReward()], steps=30, batch_size=16)
    kl = [step["train/teacher_kl"] for step in recorder.steps]
    assert sum(kl[-5:]) / 5 < 0.7 * sum(kl[:5]) / 5  # about 0.57 on this seed
    assert not any(name.startswith("teacher") for name in module.state_dict())
    assert all(not p.requires_grad for p in module.teacher.policy.parameters())
    assert "teacher" not in module.hparams


def test_a_teacher_with_another_tokenizer_is_refused_when_the_module_is_built():
    with pytest.raises(
        ValueError,
        match=r"^teacher: SortTeacher does not share the policy's tokenizer \(vocab_size is 5 for the policy, 6 for "
        r"the teacher\); distillation compares log-probs of the same token ids$",
    ):
        RLVRModule(student(), teacher=SortTeacher(vocab_size=6, prompt_length=L))


def tiny_lm(directory, vocab_size=320, **options):

    from rlvr_lightning.demos.tiny_lm import save_tiny_tokenizer, tiny_llama_config
    from rlvr_lightning.policies.hf import HFPolicy

    tokenizer = save_tiny_tokenizer(directory / str(vocab_size), vocab_size=vocab_size)
    return HFPolicy(model=HFModelOptions(config=tiny_llama_config(), tokenizer=str(tokenizer)), **options)


def test_a_lora_student_distils_from_a_separate_frozen_language_model(tmp_path):
    torch.manual_seed(0)
    policy, teacher = tiny_lm(tmp_path, lora=LoRAOptions(r=2)), tiny_lm(tmp_path)
    teacher_before = copy.deepcopy(teacher.state_dict())
    update = update_of(policy, teacher, rl_coef=0.0)
    rollout = policy.sample({"prompt": ["What is 2+3?", "Think step by step."]}, 2, SamplingConfig(max_new_tokens=5))
    rollout.advantages = torch.zeros(rollout.num_rows)
    mask = rollout.response_mask.bool()
    update.add_old_and_reference_log_probs(rollout)
    part = update.micro_batch_loss(rollout, mask, MiniBatchSizes(rollout.num_rows, mask.sum()), True, True)
    part.loss.backward()
    with torch.no_grad():
        student_log_probs = policy.token_log_probs(rollout)[0]
        teacher_log_probs = teacher.token_log_probs(rollout)[0]
    assert_close(part.teacher_kl[0][mask], (student_log_probs - teacher_log_probs)[mask], rtol=1e-5, atol=1e-5)
    trained = [name for name, p in policy.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    assert trained and all("lora_" in name for name in trained)
    assert all(p.grad is None for p in teacher.parameters())
    assert all(torch.equal(value, teacher.state_dict()[key]) for key, value in teacher_before.items())


def test_a_language_model_teacher_with_another_vocabulary_is_refused(tmp_path):
    def lm(vocab_size):
        return tiny_lm(tmp_path, vocab_size)

    policy = lm(320)
    Teacher(lm(320), policy)  # the same tokenizer, another model: accepted
    with pytest.raises(ValueError, match=r"\(the vocabularies differ \(320 tokens vs 300; e\.g\. '.*' is \d+ for the"):
        Teacher(lm(300), policy)
    with pytest.raises(ValueError, match="only the teacher has a tokenizer"):
        Teacher(policy, student())


def test_distillation_options_without_a_teacher_and_bad_weights_are_refused():
    with pytest.raises(ValueError, match=r"distillation=\{rl_coef: 0.0\} weighs .* but there is no teacher"):
        RLVRModule(student(), distillation=DistillationConfig(rl_coef=0.0))
    with pytest.raises(ValueError, match=r"distillation=\{position_weight_gamma: 0.5\} .* but there is no teacher"):
        RLVRModule(student(), distillation=DistillationConfig(position_weight_gamma=0.5))
    with pytest.raises(ValueError, match=r"^distillation.position_weight_gamma=-0.5 is not valid: must be .*>= 0$"):
        DistillationConfig(position_weight_gamma=-0.5)
    with pytest.raises(ValueError, match="distillation.rl_coef must be >= 0, got -1"):
        DistillationConfig(rl_coef=-1)
    with pytest.raises(ValueError, match="distillation.coef=0 switches distillation off"):
        DistillationConfig(coef=0.0)
    policy = student()
    with pytest.raises(ValueError, match="teacher: the teacher shares weights with the policy; give it its own model"):
        Teacher(policy, policy)
    with pytest.raises(ValueError, match=r"confidence must be in \(1/vocab_size, 1\)"):
        SortTeacher(vocab_size=5, confidence=0.1)


def test_the_command_line_names_the_teacher_whose_tokenizer_differs(in_tmp_dir, capsys):
    from pathlib import Path

    from rlvr_lightning.cli.app import entry_point

    recipe = str(Path(__file__).resolve().parents[2] / "configs" / "recipes" / "distill.yaml")
    code = entry_point(["fit", "--config", recipe, "--model.init_args.teacher.init_args.vocab_size=12"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2
    assert lines[0] == (
        "error: teacher: SortTeacher does not share the policy's tokenizer (vocab_size is 10 for the policy, 12 for "
        "the teacher); distillation compares log-probs of the same token ids"
    )
    # the value that makes the mismatch came from the command line, which the location names
    assert lines[1] == "  at model.init_args.teacher (command line: --model.init_args.teacher.init_args.vocab_size=12)"


def test_the_smollm2_distillation_config_takes_the_teacher_path_and_its_teacher_fits_the_grpo_checkpoint(
    in_tmp_dir, capsys
):
    from pathlib import Path

    import yaml

    from rlvr_lightning.cli.app import entry_point, main

    configs = Path(__file__).resolve().parents[2] / "configs"
    config, print_config = str(configs / "smollm2_distill.yaml"), ["--print_config"]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", config, "--model.init_args.teacher.init_args.checkpoint_path=t.ckpt", *print_config])
    assert exit_info.value.code in (0, None)
    model = yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]
    teacher = model["teacher"]["init_args"]
    assert teacher["checkpoint_path"] == "t.ckpt"
    assert model["distillation"] == {**vars(DistillationConfig()), "rl_coef": 0.0}
    grpo = yaml.safe_load((configs / "smollm2_arithmetic.yaml").read_text())["model"]["init_args"]["policy"]
    expected = grpo["init_args"]["policy"]["init_args"]
    shown = teacher["policy"]["init_args"]
    assert {group: {key: shown[group][key] for key in expected[group]} for group in expected} == expected
    assert entry_point(["fit", "--config", config]) == 2  # no teacher path
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "error: policy_from_checkpoint needs checkpoint_path: it has no default"
    assert lines[1].startswith(f"  at model.init_args.teacher.init_args.checkpoint_path ({config}:")


def test_ppo_distils_too(in_tmp_dir):
    from rlvr_lightning.modules import PPOModule
    from rlvr_lightning.modules.ppo_options import ValueConfig

    module = PPOModule(
        student(),
        value=ValueConfig(model="shared"),
        group_size=4,
        teacher=SortTeacher(V, L),
        distillation=DistillationConfig(rl_coef=0.5),
    )
    trainer, recorder = fit(module, [SortInclusionOrderingReward()], steps=2)
    assert trainer.global_step == 2 and module.policy_update.teacher is module.teacher
    assert all(step["train/teacher_kl"] > 0 for step in recorder.steps)
