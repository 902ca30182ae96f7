"""LanguageConsistencyReward: share of chain-of-thought words in the target language, by script or by py3langid."""

from __future__ import annotations

import sys

import pytest

from rlvr_lightning.rewards.language import LanguageConsistencyReward, chain_of_thought, language_share, script_words
from rlvr_lightning.rewards.language_id import Chunk, LangidDetector, split_for_identification
from rlvr_lightning.rewards.language_scripts import LANGUAGE_SCRIPTS
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
    reward = LanguageConsistencyReward(language="en", detector="script")
    assert reward.kind == "shaping" and reward.name == "language_consistency"
    assert reward(make_rollout(texts)).tolist() == pytest.approx([1.0, 0.5, 0.0, 0.0])
    whole = LanguageConsistencyReward(language="en", detector="script", think_only=False)
    assert whole(make_rollout(texts[:1])).tolist() == pytest.approx([4 / 6])  # the tags are not words
    assert LanguageConsistencyReward(language="zh", detector="script")(make_rollout(texts)).tolist() == pytest.approx(
        [0.0, 0.5, 1.0, 0.0]
    )


def test_unknown_language():
    with pytest.raises(ValueError, match="not supported"):
        LanguageConsistencyReward(language="klingon")


# ----------------------------------------------------------------------------- py3langid: English vs French

ENGLISH = "First we add the units, then we add the tens and carry the one."  # 14 words
FRENCH = "D'abord on additionne les unités, puis on additionne les dizaines et on retient un."  # 15 words (d' is one)


def test_split_for_identification_by_hand():
    latin = LANGUAGE_SCRIPTS["en"]
    # two sentences of 6 and 5 Latin words; the 3 ideographs are other-script words, never shown to the identifier
    chunks, other = split_for_identification(
        "Let me add the tens first. Ensuite on additionne les unités. 我们来", latin, 3
    )
    assert chunks == [Chunk("Let me add the tens first.", 6), Chunk("Ensuite on additionne les unités.", 5)]
    assert other == 3
    # short sentences merge until a chunk has min_words words; a short remainder joins the chunk before
    chunks, other = split_for_identification("Yes. So we add.\nThen the tens carry over. Done!", latin, 5)
    assert [c.words for c in chunks] == [1 + 3 + 5 + 1] and other == 0
    assert chunks[0].text == "Yes. So we add. Then the tens carry over. Done!"
    # other-script letters inside a sentence become spaces; \frac and tags are not words
    chunks, other = split_for_identification("<think> first 然后 add \\frac{1}{2}", latin, 1)
    assert chunks == [Chunk("  first    add  {1}{2}", 2)] and other == 2
    assert split_for_identification("12 + 34 = 46", latin, 1) == ([], 0)


def test_py3langid_tells_english_from_french():
    texts = [
        f"<think> {ENGLISH} </think> <answer> 42 </answer>",
        f"<think> {FRENCH} </think> <answer> 42 </answer>",
        f"<think> {ENGLISH}\n{FRENCH} </think>",  # 14 English words of 29
        f"<think> {ENGLISH} 我们来算 </think>",  # 14 of 18: ideographs count one word each
        "<think> 42 </think>",
    ]
    langid = LanguageConsistencyReward(language="en", detector="py3langid")
    assert langid.detector.name == "py3langid"
    assert langid(make_rollout(texts)).tolist() == pytest.approx([1.0, 0.0, 14 / 29, 14 / 18, 0.0])
    french = LanguageConsistencyReward(language="fr", detector="py3langid", languages=["en", "fr"])
    assert french(make_rollout(texts[:3])).tolist() == pytest.approx([0.0, 1.0, 15 / 29])
    # the script judge, the fallback, cannot tell them apart: French is "English" to it
    script = LanguageConsistencyReward(language="en", detector="script")
    assert script(make_rollout(texts)).tolist() == pytest.approx([1.0, 1.0, 1.0, 14 / 18, 0.0])


def test_auto_uses_py3langid_and_falls_back_to_scripts_without_it(monkeypatch):
    assert LanguageConsistencyReward(language="en").detector.name == "py3langid"
    monkeypatch.setitem(sys.modules, "py3langid", None)  # import py3langid now raises ImportError
    monkeypatch.setitem(sys.modules, "py3langid.langid", None)
    with pytest.warns(UserWarning, match="not installed.*English, French.*rlvr-lightning\\[language\\]"):
        reward = LanguageConsistencyReward(language="en")
    assert reward.detector.name == "script"
    assert reward(make_rollout([f"<think> {FRENCH} </think>"])).tolist() == [1.0]
    with pytest.raises(ImportError, match="py3langid language identifier is not installed: pip install"):
        LanguageConsistencyReward(language="en", detector="py3langid")


def test_bad_options_name_the_choices():
    with pytest.raises(ValueError, match="detector='langdetect' is not one of .*py3langid"):
        LanguageConsistencyReward(detector="langdetect")
    with pytest.raises(ValueError, match="does not know the language.*'xx'.*it knows"):
        LangidDetector("en", languages=["en", "xx"])
    with pytest.raises(ValueError, match="must include the target language 'en'"):
        LangidDetector("en", languages=["fr", "de"])
    with pytest.raises(ValueError, match="min_words"):
        LangidDetector("en", min_words=0)


def test_a_row_that_breaks_the_detector_costs_that_row(monkeypatch):
    reward = LanguageConsistencyReward(language="en", detector="py3langid")
    real_share = reward.detector.share

    def share(text, empty_score=0.0):
        if "boom" in text:
            raise RuntimeError("identifier crashed")
        return real_share(text, empty_score)

    monkeypatch.setattr(reward.detector, "share", share)
    scores = reward(make_rollout([ENGLISH, "boom", FRENCH]))
    assert scores.tolist() == [1.0, 0.0, 0.0] and reward.pop_errors() == 1
