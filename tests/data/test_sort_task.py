import itertools

import torch

from rlvr_lightning.data import RLVRDataModule, SortTask, collate_examples
from rlvr_lightning.data.sort_task import SortStream, prompt_hash, prompt_hash_of


def test_validation_prompts_never_appear_in_training():
    task = SortTask(vocab_size=4, length=3, num_val=64, holdout_every=5, seed=1)
    val = {tuple(example["prompt"]) for example in task.val_dataset()}
    train = {tuple(example["prompt"]) for example in itertools.islice(iter(task.train_dataset()), 5000)}
    assert val and train and not val & train


def test_held_out_prompts_are_spread_over_every_position_and_token():
    task = SortTask(vocab_size=10, length=4, num_val=500, holdout_every=10)
    val = [example["prompt"] for example in task.val_dataset()]
    # an index-based split (index % 10 == 0) would put token 0 at the last position of every validation prompt
    for position in range(4):
        assert len({prompt[position] for prompt in val}) == 10
    fraction = (
        sum(task.is_held_out([a, b, c, d]) for a in range(10) for b in range(10) for c in range(10) for d in range(10))
        / 10**4
    )
    assert 0.08 < fraction < 0.12


def test_the_scalar_prompt_hash_is_the_tensor_one():
    # [1, 2]: h = 0 * 1000003 + 1 + 1 = 2, then 2 * 1000003 + 2 + 1 = 2000009 (both under 2^31 - 1);
    # 2000009 * 2654435761 = 5308895411921849, mod 2^32 = 2301453241, >> 16 = 35117
    assert prompt_hash_of([1, 2]) == 35117 == prompt_hash(torch.tensor([[1, 2]])).item()
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 50_000, (64, 9), generator=generator)  # token ids as large as a real vocabulary's
    assert [prompt_hash_of(row) for row in prompts.tolist()] == prompt_hash(prompts).tolist()


def test_answers_are_the_sorted_prompts():
    task = SortTask(vocab_size=10, length=4)
    for example in itertools.islice(iter(task.train_dataset()), 50):
        assert example["answer"] == sorted(example["prompt"])


def test_stream_is_a_function_of_seed_and_position():
    task = SortTask(seed=3)
    first = list(itertools.islice(iter(SortStream(task)), SortStream.BLOCK + 10))
    resumed = list(itertools.islice(iter(SortStream(task, start=SortStream.BLOCK - 5)), 15))
    assert resumed == first[SortStream.BLOCK - 5 :]
    other_seed = list(itertools.islice(iter(SortStream(SortTask(seed=4))), 10))
    assert other_seed != first[:10]


def test_fixed_pool_and_collation():
    task = SortTask(num_train=20, num_val=0)
    assert len(task.train_dataset()) == 20 and task.val_dataset() is None
    batch = collate_examples([{"prompt": [2, 1], "answer": [1, 2]}, {"prompt": [0, 3], "answer": [0, 3]}])
    assert batch == {"prompt": [[2, 1], [0, 3]], "metadata": [{"answer": [1, 2]}, {"answer": [0, 3]}]}
    loader = RLVRDataModule(task, batch_size=8).train_dataloader()
    assert [len(b["prompt"]) for b in loader] == [8, 8]  # drop_last
