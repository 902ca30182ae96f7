"""JSONLTask (GSM8K / MATH / named fields), malformed lines, and the `datasets` mapping (in memory, no download)."""

from __future__ import annotations

import json

import pytest

from rlvr_lightning.data.hf_datasets import HFDatasetTask, examples_from_dataset
from rlvr_lightning.data.jsonl_task import JSONLTask, read_jsonl, record_to_example
from rlvr_lightning.data.templates import R1_ZERO_TEMPLATE

GSM8K = [
    {
        "question": "Natalia sold 48 clips in April and half as many in May. How many in total?",
        "answer": "48/2 = 24\n48+24 = 72\n#### 72",
    },
    {"question": "A shop sells 1,200 pens a day. How many in 2 days?", "answer": "1,200 * 2 = 2,400\n#### 2,400"},
]
MATH = [
    {
        "problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?",
        "solution": "It is $\\boxed{\\frac{3}{4}}$.",
        "level": "Level 1",
    },
    {"problem": "Solve $x+1=3$.", "solution": "So $x=\\boxed{2}$.", "answer": "2"},
    {"problem": "Find $\\{1,2\\}$.", "solution": "The set is $\\boxed{\\{1,2\\}}$."},
]


def write(path, records, extra_lines=()):
    lines = [json.dumps(r) for r in records] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_gsm8k_records(tmp_path):
    examples = read_jsonl(write(tmp_path / "gsm8k.jsonl", GSM8K), template="r1_zero")
    assert [e["answer"] for e in examples] == ["72", "2400"]
    assert examples[0]["question"] == GSM8K[0]["question"]
    assert examples[0]["prompt"] == R1_ZERO_TEMPLATE.replace("{question}", GSM8K[0]["question"])
    assert examples[0]["solution"] == GSM8K[0]["answer"]


def test_math_records(tmp_path):
    examples = read_jsonl(write(tmp_path / "math.jsonl", MATH), format="math", template="chat_boxed")
    assert [e["answer"] for e in examples] == ["\\frac{3}{4}", "2", "\\{1,2\\}"]
    assert examples[0]["prompt"].startswith(MATH[0]["problem"]) and "\\boxed{}" in examples[0]["prompt"]


def test_auto_format_per_record_and_named_fields(tmp_path):
    mixed = read_jsonl(write(tmp_path / "mixed.jsonl", [GSM8K[0], MATH[1]]))
    assert [e["answer"] for e in mixed] == ["72", "2"]
    fields = read_jsonl(
        write(tmp_path / "f.jsonl", [{"q": "2+2?", "a": 4}]),
        format="fields",
        question_key="q",
        answer_key="a",
        template="plain",
    )
    assert fields == [{"prompt": "Question: 2+2?\nAnswer:", "answer": "4", "question": "2+2?"}]


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"question": "x", "answer": "#### 1"', "malformed JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"question": "x", "answer": "no marker"}', "no '#### <number>'"),
        ('{"problem": "x", "solution": "no box"}', "no \\\\boxed"),
        ('{"text": "x"}', "cannot tell the format"),
        ('{"question": "", "answer": "#### 1"}', "empty question"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad_line, message):
    path = write(tmp_path / "data.jsonl", GSM8K, extra_lines=["", bad_line])  # line 3 is blank, 4 is bad
    with pytest.raises(ValueError, match=rf"data\.jsonl:4: .*{message}"):
        read_jsonl(path)


def test_a_missing_field_names_the_fields_the_record_has(tmp_path):
    path = write(tmp_path / "missing_field.jsonl", GSM8K * 2, extra_lines=['{"question": "x"}'])
    with pytest.raises(ValueError) as raised:
        read_jsonl(path)
    assert str(raised.value) == f"{path}:5: missing field 'answer' (the record has question)"


@pytest.mark.parametrize(
    "record, message",
    [
        ({"question": 5, "answer": "#### 5"}, "field 'question' is a number (5), not a string"),
        ({"question": ["x"], "answer": "#### 5"}, """field 'question' is a list (["x"]), not a string"""),
        ({"problem": {"x": 1}, "solution": "\\boxed{1}"}, """field 'problem' is an object ({"x": 1}), not a string"""),
        ({"question": "x", "answer": 72}, "field 'answer' is a number (72), not a string"),  # GSM8K: '#### 72'
        ({"problem": "x", "answer": True}, "field 'answer' is a boolean (true), not a string or a number"),
    ],
)
def test_a_field_of_the_wrong_type_is_refused_not_turned_into_text(tmp_path, record, message):
    path = write(tmp_path / "data.jsonl", [record])
    with pytest.raises(ValueError) as raised:
        read_jsonl(path)
    assert str(raised.value) == f"{path}:1: {message}"


def test_a_numeric_answer_is_read_as_its_text(tmp_path):
    assert read_jsonl(write(tmp_path / "m.jsonl", [{"problem": "1+1?", "answer": 2}]))[0]["answer"] == "2"


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_jsonl(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match="no examples"):
        read_jsonl(tmp_path / "empty.jsonl")


def test_task_splits(tmp_path):
    train = write(tmp_path / "train.jsonl", GSM8K * 5)
    test = write(tmp_path / "test.jsonl", MATH)
    task = JSONLTask(train, val_path=test, num_val=2)
    assert len(task.train_dataset()) == 10 and len(task.val_dataset()) == 2
    held = JSONLTask(train, num_val=3, seed=1)
    assert len(held.train_dataset()) == 7 and len(held.val_dataset()) == 3
    assert JSONLTask(train).val_dataset() is None
    assert len(JSONLTask(train, limit=4).train_dataset()) == 4
    with pytest.raises(ValueError, match="leaves no training examples"):
        JSONLTask(train, num_val=10).train_dataset()
    with pytest.raises(ValueError, match="format"):
        JSONLTask(train, format="csv")


def test_record_to_example_rejects_non_objects():
    from rlvr_lightning.data.jsonl_task import RecordError

    with pytest.raises(RecordError):
        record_to_example("just a string")


# ----------------------------------------------------------------------------- datasets (in memory)


def test_hf_mapping_on_an_in_memory_dataset():
    datasets = pytest.importorskip("datasets")
    gsm8k = datasets.Dataset.from_list(GSM8K)
    examples = examples_from_dataset(gsm8k, template="r1_zero")
    assert [e["answer"] for e in examples] == ["72", "2400"]
    task = HFDatasetTask("openai/gsm8k", config_name="main", template="r1_zero")  # nothing is loaded here
    assert task.to_examples(gsm8k) == examples
    math = datasets.Dataset.from_list([{"problem": m["problem"], "solution": m["solution"]} for m in MATH])
    assert [e["answer"] for e in HFDatasetTask("x", format="math").to_examples(math)] == [
        "\\frac{3}{4}",
        "2",
        "\\{1,2\\}",
    ]
    bad = datasets.Dataset.from_list([GSM8K[0], {"question": "q", "answer": "no marker"}])
    with pytest.raises(ValueError, match=r"openai/gsm8k:test\[1\]: .*####"):
        task.to_examples(bad, split="test")


def test_hf_task_loads_through_datasets_lazily(monkeypatch):
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load_dataset(name, config, split, revision=None, data_files=None):
        calls.append((name, config, split))
        return datasets.Dataset.from_list(GSM8K if split == "train" else GSM8K[:1])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    task = HFDatasetTask("openai/gsm8k", config_name="main", split="train", val_split="test", num_val=1)
    assert calls == []  # construction (and --print_config) loads nothing
    assert len(task.train_dataset()) == 2 and len(task.val_dataset()) == 1
    assert len(task.train_dataset()) == 2 and calls == [
        ("openai/gsm8k", "main", "train"),
        ("openai/gsm8k", "main", "test"),
    ]
    assert HFDatasetTask("x", val_split=None).val_dataset() is None


# ----------------------------------------------------------------------------- hostile / unusual files


@pytest.mark.parametrize(
    "final, gold",
    [
        ("1/2", "1/2"),
        ("1e3", "1e3"),
        ("1 000", "1000"),
        ("1,234.5", "1234.5"),
        ("-3.5", "-3.5"),
        ("$1,000", "1000"),
        ("72.", "72"),
    ],
)
def test_gsm8k_gold_keeps_the_whole_final_answer(tmp_path, final, gold):
    # the whole answer, not cut at the first character that is not a digit or a comma ("1/2" is not "1")
    path = write(tmp_path / "g.jsonl", [{"question": "q?", "answer": f"work\n#### {final}"}])
    assert read_jsonl(path)[0]["answer"] == gold


@pytest.mark.parametrize("final", ["3,14", "1,000,0000", "5 apples", "seven"])
def test_gsm8k_gold_that_cannot_be_parsed_names_file_and_line(tmp_path, final):
    # read as "314", "#### 3,14" would score a correct "3.14" 0 for the whole run: it is refused
    path = write(tmp_path / "g.jsonl", GSM8K, extra_lines=[json.dumps({"question": "q?", "answer": f"#### {final}"})])
    with pytest.raises(ValueError, match=rf"g\.jsonl:3: GSM8K record: .*'{final}'"):
        read_jsonl(path)


def test_non_utf8_bytes_name_file_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(
        json.dumps(GSM8K[0]).encode() + b"\n" + '{"question": "caf\u00e9?", "answer": "#### 1"}\n'.encode("latin-1")
    )
    with pytest.raises(ValueError, match=r"latin1\.jsonl:2: not UTF-8: byte 0xe9 at byte 18"):
        read_jsonl(path)


def test_deeply_nested_json_names_file_and_line(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text(json.dumps(GSM8K[0]) + "\n" + "[" * 200_000 + "]" * 200_000 + "\n")
    with pytest.raises(ValueError, match=r"deep\.jsonl:2: JSON nested too deeply"):
        read_jsonl(path)


def test_a_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(r) for r in GSM8K).encode() + b"\n")
    assert [e["answer"] for e in read_jsonl(path)] == ["72", "2400"]


def test_huge_lines_and_prompts_fail_at_load_naming_file_and_line(tmp_path):
    from rlvr_lightning.data.jsonl_task import MAX_LINE_BYTES

    # a 50 MB line is refused before it is parsed
    huge = tmp_path / "huge.jsonl"
    with huge.open("w") as f:
        f.write(json.dumps(GSM8K[0]) + "\n")
        f.write(json.dumps({"question": "x " * 25_000_000, "answer": "#### 1"}) + "\n")
    with pytest.raises(ValueError, match=rf"huge\.jsonl:2: line longer than {MAX_LINE_BYTES:,} bytes"):
        read_jsonl(huge)
    # a prompt over max_prompt_chars (default 100,000) is refused with its length
    long = write(tmp_path / "long.jsonl", [GSM8K[0], {"question": "y" * 150_000, "answer": "#### 1"}])
    with pytest.raises(
        ValueError, match=r"long\.jsonl:2: the prompt is 150,0\d\d characters long, over max_prompt_chars=100,000"
    ):
        read_jsonl(long)
    with pytest.raises(ValueError, match=r"long\.jsonl:2: .*over max_prompt_chars=1,000"):
        JSONLTask(long, max_prompt_chars=1000).train_dataset()
    assert len(read_jsonl(long, max_prompt_chars=None)) == 2


def test_example_locations_follow_the_split(tmp_path):
    path = write(tmp_path / "d.jsonl", GSM8K * 3, extra_lines=[])
    task = JSONLTask(path, num_val=2, seed=0)
    train, val = task.split()
    located = [(task.example_location("train", i), e["question"]) for i, e in enumerate(train)]
    located += [(task.example_location("val", i), e["question"]) for i, e in enumerate(val)]
    lines = {f"{path}:{n + 1}": GSM8K[n % 2]["question"] for n in range(6)}
    assert sorted(located) == sorted(lines.items())
