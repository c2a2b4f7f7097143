"""benchmarks/token_gap.py's pure parts: which predicted tokens are upper-case or copyable, and the share of a
model's excess that its worst tokens hold."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "token_gap_bench", Path(__file__).resolve().parents[2] / "benchmarks/token_gap.py")
token_gap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(token_gap)


class Words:
    """A tokenizer stand-in: token t decodes to WORDS[t]."""

    WORDS = [" the", " AS", " IS", "OF", " 1990", ",", " Licensee", "X"]

    def decode(self, ids):
        return "".join(self.WORDS[t] for t in ids)


def test_upper_case_marks_tokens_with_letters_and_none_lower_case():
    windows = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7]])
    got = token_gap.upper_case(windows, Words())  # the predicted tokens: windows[:, 1:]
    assert got.tolist() == [[True, True, True, False, False, False, True]]


def test_copyable_marks_a_trigram_seen_before_in_its_window():
    windows = torch.tensor([[5, 1, 2, 3, 1, 2, 3, 1, 2]])
    assert token_gap.copyable(windows).tolist() == [[False, False, False, False, False, True, True, True]]


def test_worst_share_is_the_part_of_the_excess_the_worst_tokens_hold():
    excess = torch.tensor([[4.0, 1.0] + [0.0] * 18, [-1.0] + [0.0] * 19])  # 40 tokens: the worst 5% are 2
    assert token_gap.worst_share(excess) == pytest.approx(5.0 / 4.0)  # above 1: the rest gained
    assert token_gap.worst_share(torch.ones(2, 20)) == pytest.approx(0.05)
