"""LanguageConsistencyReward: share of chain-of-thought words in the target language's script."""

from __future__ import annotations

import pytest

from rlvr_lightning.rewards.language import LanguageConsistencyReward, chain_of_thought, language_share, script_words
from tests.rewards.test_math_reward import make_rollout

LATIN = frozenset({"LATIN"})
CJK = frozenset({"CJK"})


@pytest.mark.parametrize(
    "text, words",
    [
        ("Let me add them", ["LATIN"] * 4),
        ("我们来计算", ["CJK"] * 5),  # no spaces: one word per ideograph
        ("so 我们 add", ["LATIN", "CJK", "CJK", "LATIN"]),
        ("12 + 34 = 46, \\frac{1}{2} $$ ...", []),  # numbers, symbols and LaTeX commands are not words
        ("привет мир", ["CYRILLIC", "CYRILLIC"]),
        ("café naïve", ["LATIN", "LATIN"]),
        ("カタカナ", ["KATAKANA"] * 4),
        ("", []),
    ],
)
def test_script_words(text, words):
    assert script_words(text) == words


def test_chain_of_thought_is_the_think_block():
    assert chain_of_thought("<think> reason </think> <answer> 4 </answer>") == " reason "
    assert chain_of_thought(" reason </think> <answer> 4 </answer>") == " reason "  # R1-Zero: opened in the prompt
    assert chain_of_thought("no tags at all") == "no tags at all"


def test_language_share_by_hand():
    assert language_share("Let me add 我们来", LATIN) == pytest.approx(3 / 6)
    assert language_share("Let me add 我们来", CJK) == pytest.approx(3 / 6)
    assert language_share("12 + 34", LATIN) == 0.0
    assert language_share("12 + 34", LATIN, empty_score=1.0) == 1.0


def test_reward_scores_the_chain_of_thought_only():
    texts = [
        "<think> first add the tens </think> <answer> 答案 </answer>",  # answer language does not count
        "<think> first 然后 add </think> <answer> 4 </answer>",  # 2 Latin words of 4
        "<think> 首先 </think> <answer> four </answer>",
        "<think> 42 </think> <answer> 42 </answer>",  # no words
    ]
    reward = LanguageConsistencyReward(language="en")
    assert reward.kind == "shaping" and reward.name == "language_consistency"
    assert reward(make_rollout(texts)).tolist() == pytest.approx([1.0, 0.5, 0.0, 0.0])
    whole = LanguageConsistencyReward(language="en", think_only=False)
    assert whole(make_rollout(texts[:1])).tolist() == pytest.approx([4 / 6])  # the tags are not words
    assert LanguageConsistencyReward(language="zh")(make_rollout(texts)).tolist() == pytest.approx([0.0, 0.5, 1.0, 0.0])


def test_unknown_language():
    with pytest.raises(ValueError, match="not supported"):
        LanguageConsistencyReward(language="klingon")
