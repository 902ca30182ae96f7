"""scripts/check_gsm8k_answers.py takes the data directory as an argument and says where to get GSM8K."""

import json
from pathlib import Path

from tests.script_modules import load_script

REPO = Path(__file__).resolve().parents[1]


def test_missing_data_says_where_to_get_it(tmp_path, capsys):
    assert load_script("check_gsm8k_answers").main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"missing file: {tmp_path / 'train.jsonl'}" in err
    assert "https://github.com/openai/grade-school-math" in err and "python scripts/check_gsm8k_answers.py DIR" in err


def test_checks_the_files_in_the_directory_given(tmp_path, capsys):
    for name, golds in (("train.jsonl", ["72", "10"]), ("test.jsonl", ["18"])):
        rows = [{"question": f"q{i}", "answer": f"work\n#### {gold}"} for i, gold in enumerate(golds)]
        (tmp_path / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert load_script("check_gsm8k_answers").main([str(tmp_path), "--workers", "1", "--skip-rewrite"]) == 0
    out = capsys.readouterr().out
    assert "correct-gold matches:  3/3" in out and "perturbed rejections:  3/3" in out
