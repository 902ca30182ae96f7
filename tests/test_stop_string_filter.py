"""The stop-string pre-filter (`generation/stop_strings.py`): a token without any stop string's last byte cannot end
its row, so its row is not decoded; the rows that end, where and why are those of the check without the filter."""

from __future__ import annotations

import random

import pytest

from rlvr_lightning.demos.tiny_lm import EOS, build_tiny_tokenizer
from rlvr_lightning.generation.output import StopStringChecker
from rlvr_lightning.generation.row_ends import RowEnds
from rlvr_lightning.generation.stop_strings import byte_level_alphabet, stop_string_end_filter

STOPS = ["</answer>", "ab", "\n\n", "é!", "→"]  # ASCII, a repeated pair, whitespace, two- and three-byte characters


@pytest.fixture(scope="module")
def tokenizer():
    corpus = ["<answer>42</answer> ab abc", "café! naïve → arrow", "line\n\nnext", "The answer is 5."]
    return build_tiny_tokenizer(vocab_size=400, corpus=corpus)


def test_the_alphabet_is_gpt2s_bytes_to_unicode_inverted():
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    assert byte_level_alphabet() == {character: byte for byte, character in bytes_to_unicode().items()}
    assert byte_level_alphabet()["Ġ"] == ord(" ") and byte_level_alphabet()["Ċ"] == ord("\n")


def test_tokens_by_hand(tokenizer):
    may_end = stop_string_end_filter(tokenizer, ["</answer>"])
    ids = {piece: tokenizer.convert_tokens_to_ids(piece) for piece in (">", "<", "a", "Ġ")}
    assert may_end(ids[">"])  # '>' is the last byte of "</answer>"
    assert not may_end(ids["<"]) and not may_end(ids["a"]) and not may_end(ids["Ġ"])
    assert may_end(tokenizer.convert_tokens_to_ids(EOS))  # an added token: always checked
    arrow = stop_string_end_filter(tokenizer, ["→"])  # "→" is E2 86 92: only a token with byte 0x92 completes it
    last = next(c for c, b in byte_level_alphabet().items() if b == 0x92)
    first = next(c for c, b in byte_level_alphabet().items() if b == 0xE2)
    assert arrow(tokenizer.convert_tokens_to_ids(last)) and not arrow(tokenizer.convert_tokens_to_ids(first))


def test_no_filter_where_the_decoder_is_not_byte_level_or_cleans_up_spaces(tokenizer):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    assert stop_string_end_filter(tokenizer, []) is None
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    wordpiece.pre_tokenizer, wordpiece.decoder = pre_tokenizers.Whitespace(), decoders.WordPiece()
    assert stop_string_end_filter(PreTrainedTokenizerFast(tokenizer_object=wordpiece), ["ab"]) is None
    cleaning = build_tiny_tokenizer()
    cleaning.clean_up_tokenization_spaces = True
    assert stop_string_end_filter(cleaning, ["ab"]) is None


def sequences(tokenizer, rows: int, steps: int, seed: int) -> list[list[int]]:
    """Token rows that meet the stop strings now and then: encoded fragments (stop strings, their pieces, text with
    multi-byte characters) and single random tokens, some of them lone bytes of a multi-byte character."""
    rng = random.Random(seed)
    fragments = [*STOPS, "</answer", ">", "a", "b", "é", "!", "\n", "→", "x y", "<answer>", "café", " 12"]
    vocab = len(tokenizer)
    out = []
    for _ in range(rows):
        row: list[int] = []
        while len(row) < steps:
            if rng.random() < 0.3:
                row.append(rng.randrange(vocab))
            else:
                row += tokenizer.encode(rng.choice(fragments), add_special_tokens=False)
        out.append(row[:steps])
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rows_end_where_and_why_they_end_without_the_filter(tokenizer, seed):
    rows, steps = 200, 40
    tokens = sequences(tokenizer, rows, steps, seed)
    decode = lambda batch: tokenizer.batch_decode(batch, skip_special_tokens=True)  # noqa: E731
    decoded = []
    plain = RowEnds(rows, steps, [tokenizer.eos_token_id], StopStringChecker(STOPS, decode), None)
    counting = lambda batch: decoded.append(len(batch)) or decode(batch)  # noqa: E731
    checker = StopStringChecker(STOPS, counting, stop_string_end_filter(tokenizer, STOPS))
    filtered = RowEnds(rows, steps, [tokenizer.eos_token_id], checker, None)
    for step in range(steps):
        for row_ends in (plain, filtered):
            alive = [row for row, live in zip(row_ends.active, row_ends.alive, strict=True) if live]
            sampled = [tokens[row][step] if row in alive else 0 for row in row_ends.active]
            row_ends.end(sampled, step)
    assert filtered.lengths == plain.lengths and filtered.finished == plain.finished
    assert filtered.by_string == plain.by_string
    assert sum(plain.by_string) > rows // 4  # the stop strings were met, at many steps
    assert sum(decoded) < sum(plain.lengths) / 2  # and most rows were not decoded at most steps
