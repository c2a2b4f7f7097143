"""Calibration/evaluation text: the pydoc split, reading user files, token windows."""

import pytest
import torch

from gac.calibration.texts import (EVAL_EVERY, TextConfig, load_windows, pydoc_split, read_text, stdlib_sources,
                                   token_windows)
from gac.errors import GacError
from tests.helpers_tiny import tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _paragraphs(text):
    return {p.strip() for p in text.split("\n\n") if p.strip()}


def test_pydoc_split_is_deterministic_and_non_trivial():
    calib, held_out = pydoc_split()
    assert pydoc_split() == (calib, held_out)
    assert len(calib) > 50_000 and len(held_out) > 10_000
    assert len(calib) > len(held_out)  # most of the text calibrates; a fifth of the topics is held out


def test_pydoc_split_partitions_the_topics():
    from pydoc_data.topics import topics

    calib, held_out = pydoc_split()
    keys = sorted(topics)
    held_keys = [k for i, k in enumerate(keys) if i % EVAL_EVERY == 0]
    calib_keys = [k for k in keys if k not in held_keys]
    assert held_keys and calib_keys
    # held-out topics land whole; calibration holds only paragraphs of the other topics
    assert held_out == "\n\n".join(topics[k] for k in held_keys)
    calib_paragraphs = {p.strip() for k in calib_keys for p in topics[k].split("\n\n")}
    assert all(p.strip() in calib_paragraphs for p in calib.split("\n\n"))
    assert len(calib) > 4 * len(held_out)


def test_pydoc_split_shares_no_paragraph():
    calib, held_out = pydoc_split()
    shared = _paragraphs(calib) & _paragraphs(held_out)
    assert not shared, f"{len(shared)} held-out paragraphs also in calibration, e.g. {next(iter(shared))[:60]!r}"


def test_read_text_returns_content(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("héllo\nworld", encoding="utf-8")
    assert read_text(p) == "héllo\nworld"
    assert read_text(str(p)) == "héllo\nworld"


@pytest.mark.parametrize("content", ["", "  \n\t\n"])
def test_read_text_empty_file_raises_with_path(tmp_path, content):
    p = tmp_path / "empty.txt"
    p.write_text(content)
    with pytest.raises(GacError, match="empty") as info:
        read_text(p)
    assert str(p) in str(info.value)
    assert "\n" not in str(info.value)


def test_read_text_missing_file_raises_with_path(tmp_path):
    p = tmp_path / "no" / "such.txt"
    with pytest.raises(GacError, match="cannot read") as info:
        read_text(p)
    assert str(p) in str(info.value)
    assert "\n" not in str(info.value)


def test_read_text_directory_raises(tmp_path):
    with pytest.raises(GacError) as info:
        read_text(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_token_windows_shapes_and_content(tokenizer):
    text = pydoc_split()[1]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    w = token_windows(tokenizer, text, 32, 5, what="evaluation")
    assert w.shape == (5, 32)
    assert w.dtype == torch.long
    assert w.flatten().tolist() == ids[: 5 * 32]  # consecutive, non-overlapping, from the start
    short = text[:2000]
    n_ids = len(tokenizer(short, add_special_tokens=False)["input_ids"])
    w = token_windows(tokenizer, short, 16, 10_000, what="evaluation")
    assert w.shape == (n_ids // 16, 16)  # capped by the text, not by max_windows


def test_every_window_starts_with_bos_where_the_tokenizer_starts_a_sequence_with_it():
    """A tokenizer that puts BOS first (Gemma's): each window is BOS and the next seq_len - 1 text tokens, so every
    text token is still predicted once; one that puts none (the tiny BPE) keeps plain windows."""
    from tests.helpers import sentencepiece_bpe_tokenizer

    tok = sentencepiece_bpe_tokenizer()
    tok.add_bos_token = True
    text = pydoc_split()[1][:20_000]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok(text)["input_ids"][0] == tok.bos_token_id
    w = token_windows(tok, text, 32, 5, what="evaluation")
    assert w.shape == (5, 32) and w[:, 0].tolist() == [tok.bos_token_id] * 5
    assert w[:, 1:].flatten().tolist() == ids[: 5 * 31]
    tok.add_bos_token = False
    assert token_windows(tok, text, 32, 5, what="evaluation").flatten().tolist() == ids[: 5 * 32]


def test_token_windows_fewer_than_one_window_raises(tokenizer):
    text = "a few words"
    n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    with pytest.raises(GacError, match=f"calibration text has {n} tokens, fewer than one window of {n + 1}"):
        token_windows(tokenizer, text, n + 1, 4, what="calibration")
    assert token_windows(tokenizer, text, n, 4, what="calibration").shape == (1, n)


def test_stdlib_sources_are_whole_module_files_up_to_the_token_count(tokenizer, tmp_path, monkeypatch):
    """The standard library's module sources, never its tests or site-packages, whole files in one seeded order,
    until they hold the tokens asked (the last file may pass it)."""
    import sysconfig

    modules = {f"m{i}.py": f"def f{i}(x):\n    return x + {i}  # module {i}\n" * 20 for i in range(6)}
    modules["pkg/inner.py"] = "class Inner:\n    pass\n" * 20
    others = {"test/test_m0.py": "TESTS", "pkg/tests/t.py": "TESTS", "site-packages/p.py": "INSTALLED",
              "idlelib/idle_test/t.py": "TESTS", "notes.txt": "TEXT"}
    for name, text in {**modules, **others}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    every = stdlib_sources(tokenizer, 10**9)
    assert all(t in every for t in modules.values())
    assert len(every) == sum(map(len, modules.values())) + 2 * (len(modules) - 1)  # each whole, once
    assert not any(word in every for word in ("TESTS", "INSTALLED", "TEXT"))
    assert every == stdlib_sources(tokenizer, 10**9) and every != stdlib_sources(tokenizer, 10**9, seed=1)
    one = len(tokenizer(modules["m0.py"], add_special_tokens=False)["input_ids"])
    some = stdlib_sources(tokenizer, 2 * one)
    assert every.startswith(some) and some.count("def f") + some.count("class Inner") in (40, 60)


@pytest.mark.slow
def test_load_windows_uses_user_files(tmp_path, tokenizer):
    from pydoc_data.topics import topics

    calib_text, eval_text = topics["specialnames"], topics["bitwise"] * 4
    (tmp_path / "c.txt").write_text(calib_text)
    (tmp_path / "e.txt").write_text(eval_text)
    cfg = TextConfig(calib_file=str(tmp_path / "c.txt"), eval_file=str(tmp_path / "e.txt"), seq_len=16,
                     calib_windows=3, eval_windows=2)
    calib, held_out = load_windows(tokenizer, cfg)
    every = token_windows(tokenizer, calib_text, 16, 1 << 30, what="c")  # the user's text, spread as the default
    assert torch.equal(calib, every[[0, round((every.shape[0] - 1) / 2), every.shape[0] - 1]])
    assert torch.equal(held_out, token_windows(tokenizer, eval_text, 16, 2, what="e"))
    default_calib, default_eval = load_windows(tokenizer, TextConfig(seq_len=16, calib_windows=3, eval_windows=2))
    assert not torch.equal(calib, default_calib)
    assert not torch.equal(default_calib, default_eval)
    # only one user file: the other part falls back to the pydoc default
    c2, e2 = load_windows(tokenizer, TextConfig(calib_file=str(tmp_path / "c.txt"), seq_len=16, calib_windows=3,
                                                eval_windows=2))
    assert torch.equal(c2, calib) and torch.equal(e2, default_eval)


def test_load_windows_missing_user_file_raises(tmp_path, tokenizer):
    missing = tmp_path / "missing.txt"
    with pytest.raises(GacError) as info:
        load_windows(tokenizer, TextConfig(eval_file=str(missing), seq_len=16))
    assert str(missing) in str(info.value)


@pytest.mark.slow
def test_calibration_windows_spread_over_the_whole_text(tokenizer):
    """The calibrating windows are cfg.calib_windows of the text's windows spread evenly from its first to its last,
    in order; the held-back windows are others, never a calibrating one; a text of fewer windows calibrates on all."""
    from gac.calibration.texts import HELD_BACK_WINDOWS, calibration_windows, held_back_windows

    cfg = TextConfig(seq_len=64, calib_windows=5)
    every = token_windows(tokenizer, pydoc_split()[0], 64, 1 << 30, what="calibration")
    calib, rest = calibration_windows(tokenizer, cfg)
    assert calib.shape == (5, 64) and rest.shape == (every.shape[0] - 5, 64)
    assert torch.equal(calib[0], every[0]) and torch.equal(calib[-1], every[-1])
    rows = [next(i for i, w in enumerate(every) if torch.equal(w, c)) for c in calib]
    gaps = [b - a for a, b in zip(rows, rows[1:])]
    assert max(gaps) - min(gaps) <= 1 and min(gaps) > every.shape[0] // 10  # even, and over the whole text
    assert torch.equal(load_windows(tokenizer, cfg)[0], calib)
    held_back = held_back_windows(tokenizer, cfg)
    assert held_back.shape == (HELD_BACK_WINDOWS, 64)
    assert not any(torch.equal(h, c) for h in held_back for c in calib)
    few = TextConfig(seq_len=64, calib_windows=every.shape[0] + 3)
    assert torch.equal(calibration_windows(tokenizer, few)[0], every)
    with pytest.raises(GacError, match="no window of 64 tokens beside the"):
        held_back_windows(tokenizer, few)
