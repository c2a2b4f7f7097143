"""gac.heal on a tiny random model: healing lowers the held-out loss, leaves dims and parameter counts unchanged,
never trains on the evaluation windows, saves atomically and refuses bad input in one line."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from gac.api import CompressConfig, compress
from gac.calibration.texts import TextConfig
from gac.errors import GacError
from gac.heal.distill import DistillConfig, distill, held_out_loss, trainable_parameters
from gac.heal.run import HealConfig, heal_dir
from gac.heal.texts import heal_windows, sharing
from tests.helpers import assert_one_error_line, gac_cli, run_gac

TEXT = TextConfig(seq_len=32, calib_windows=4, eval_windows=2)
HEAL = HealConfig(text=TEXT, distill=DistillConfig(tokens=32 * 2 * 24, lr=3e-3, eval_every=6, patience=3),
                  progress=False)


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """A tiny random Llama with peaked logits (initializer_range 0.3; at the default 0.02 its next-token
    distributions are near uniform and compressing it costs almost no KL to win back)."""
    import transformers

    from tests.helpers_tiny import TINY, tiny_tokenizer

    d = tmp_path_factory.mktemp("heal") / "original"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY, initializer_range=0.3)).save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def compressed(original, tmp_path_factory):
    """A gac output of the tiny model (asvd at 0.3), its original recorded in gac_plan.json."""
    out = tmp_path_factory.mktemp("heal") / "asvd"
    compress(CompressConfig(model=str(original), compressor="asvd", ratio=0.3, out=str(out), text=TEXT,
                            evaluate=False, progress=False))
    return out


@pytest.fixture(scope="module")
def healed(compressed, tmp_path_factory):
    out = tmp_path_factory.mktemp("heal") / "healed"
    return heal_dir(str(compressed), str(out), HEAL)


@pytest.fixture(scope="module")
def docs_file(tmp_path_factory):
    """The calibration docs alone as a healing file: the windows the training-loop tests were tuned on, apart from
    the default healing text's standard-library sources."""
    from gac.calibration.texts import pydoc_split

    path = tmp_path_factory.mktemp("heal") / "docs.txt"
    path.write_text(pydoc_split()[0])
    return str(path)


def _structure_and_params(path):
    import gac

    model = gac.load(path).model
    return model.config.gac_structure, sum(p.numel() for p in model.parameters()), model


@pytest.mark.slow
def test_healing_lowers_the_held_out_loss(healed):
    run = healed.report["run"]
    losses = dict(run["held_out_loss"])
    assert run["best_step"] > 0 and losses[run["best_step"]] < losses[0]
    assert run["tokens"] > 0 and run["trainable_params"] > 0
    p = healed.report["ppl"]
    assert p["after"]["held_out"] < p["before"]["held_out"]


@pytest.mark.slow
def test_module_fixtures_cache_the_originals_perplexities_privately(healed):
    """The module's heal (set up before any function fixture) caches in the tests' directory, not ~/.cache/gac."""
    import os
    from pathlib import Path

    cache = Path(os.environ["GAC_CACHE_DIR"]) / "perplexity"
    assert healed.report["ppl"]["original"] in [json.loads(f.read_text()) for f in cache.glob("*.json")]


@pytest.mark.slow
def test_healed_output_keeps_dims_and_params_and_loads_everywhere(compressed, healed):
    from transformers import AutoModelForCausalLM

    import gac  # noqa: F401 - registers gac's model types with transformers

    structure, params, before = _structure_and_params(compressed)
    structure_after, params_after, model = _structure_and_params(healed.out)
    assert structure_after == structure and params_after == params == healed.report["params"]
    changed = [n for (n, a), (_, b) in zip(before.named_parameters(), model.named_parameters()) if not torch.equal(a, b)]
    assert changed  # it trained
    plain = AutoModelForCausalLM.from_pretrained(healed.out).eval()
    ids = torch.arange(24)[None]
    with torch.inference_mode():
        assert torch.allclose(plain(ids).logits, model(ids).logits, atol=1e-5)
    plan = json.loads((healed.out / "gac_plan.json").read_text())
    original = json.loads((compressed / "gac_plan.json").read_text())
    assert plan["dims"] == original["dims"] and plan["variant"] == original["variant"]
    assert plan["healed"]["original"] == original["source_model"]
    assert json.loads((healed.out / "heal.json").read_text()) == json.loads(json.dumps(healed.report))
    _assert_heal_png(healed.out / "heal.png")


def _assert_heal_png(path):
    """heal.png is a PNG of the plot's size (12 x 4.6 inches at 110 dpi)."""
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width = matplotlib.image.imread(path).shape[:2]
    assert (width, height) == (1320, 506)


@pytest.mark.slow
def test_evaluation_windows_are_never_trained_on(tmp_path, compressed):
    import gac
    from gac.calibration.texts import pydoc_split

    tokenizer = gac.load(compressed).tokenizer
    calib, docs = pydoc_split()
    leaky = tmp_path / "leaky.txt"
    leaky.write_text(docs[:20000] + "\n\n" + calib[:60000])  # the held-out docs inside the healing text
    for heal_file in (None, str(leaky)):
        t = heal_windows(tokenizer, heal_file=heal_file, eval_file=None, unlike_file=None, seq_len=32, eval_windows=8)
        evaluation = list(t.evaluated().values())
        assert not sharing(t.train, evaluation).any() and not sharing(t.val, evaluation).any()
        assert (t.dropped > 0) == (heal_file is not None)
    assert sharing(t.held_out[:1], evaluation).all()  # the check finds what it looks for


@pytest.mark.slow
def test_the_default_healing_text_is_stdlib_sources_beside_the_docs(compressed):
    """By default healing trains on the calibration docs and as many tokens of the standard library's sources (a
    kind of text the docs lack), and stops early on the docs' windows, as it did on the docs alone."""
    import gac
    from gac.calibration.texts import pydoc_split, stdlib_sources, token_windows
    from gac.heal.texts import SOURCES_SHARE

    tokenizer = gac.load(compressed).tokenizer
    t = heal_windows(tokenizer, heal_file=None, eval_file=None, unlike_file=None, seq_len=32, eval_windows=2)
    docs = token_windows(tokenizer, pydoc_split()[0], 32, 1 << 30, what="calibration")
    doc_rows = {tuple(r) for r in docs.tolist()}
    assert all(tuple(r) in doc_rows for r in t.val.tolist())
    from_docs = sum(tuple(r) in doc_rows for r in t.train.tolist())
    assert from_docs == docs.shape[0] - t.val.shape[0] - t.dropped
    sources = t.train.shape[0] - from_docs
    assert SOURCES_SHARE * docs.shape[0] - 1 <= sources < 2 * SOURCES_SHARE * docs.shape[0]  # whole files: past it
    code = stdlib_sources(tokenizer, 32 * sources)
    assert tokenizer.decode(t.train[0]) in code and "standard-library sources" in t.names["train"]


def test_without_the_stdlib_sources_healing_reads_the_docs_alone(compressed, tmp_path, monkeypatch, caplog):
    """A Python that ships its standard library as bytecode only: the default healing text is the docs, with a
    warning, not a refusal."""
    import sysconfig

    import gac
    from gac.calibration.texts import pydoc_split, token_windows

    tokenizer = gac.load(compressed).tokenizer
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    (tmp_path / "LICENSE.txt").write_text(" ".join(f"clause {i} of the licence." for i in range(400)))
    t = heal_windows(tokenizer, heal_file=None, eval_file=None, unlike_file=None, seq_len=32, eval_windows=2)
    docs = token_windows(tokenizer, pydoc_split()[0], 32, 1 << 30, what="calibration")
    assert torch.equal(torch.cat([t.train, t.val]), docs[~sharing(docs, list(t.evaluated().values()))])
    assert "no standard-library sources" in caplog.text and "sources" not in t.names["train"]


def test_early_stop_keeps_the_best_tensors(compressed, original, docs_file, monkeypatch):
    """Training at a large learning rate whose evaluations only get worse: the run backs off once, stops early and
    the student is as it came. The evaluations after the first read 1% worse than they measure: whether lr 0.5 makes
    a tiny random model's held-out loss worse is up to the CPU's arithmetic (on an AVX512-BF16 Xeon its second
    evaluation was 0.2% better), and the mechanism under test is what follows a worse evaluation."""
    import importlib

    import gac
    from gac.checkpoint.loading import load_model

    distill_module = importlib.import_module("gac.heal.distill")  # gac.heal.distill is the function
    calls = []

    def worse_after_the_first(*args, **kw):
        calls.append(held_out_loss(*args, **kw))
        return calls[-1] * (1.01 if len(calls) > 1 else 1.0)

    monkeypatch.setattr(distill_module, "held_out_loss", worse_after_the_first)
    student, teacher = gac.load(compressed).model, load_model(str(original)).model
    t = heal_windows(gac.load(compressed).tokenizer, heal_file=docs_file, eval_file=None, unlike_file=None, seq_len=32,
                     eval_windows=2)
    before = [p.detach().clone() for p in student.parameters()]
    kl = held_out_loss(student, teacher, t.val, 2)
    result = distill(student, teacher, t.train, t.val, DistillConfig(tokens=32 * 2 * 40, lr=0.5, eval_every=2,
                                                                     patience=2, warmup=0.0), progress=False)
    assert result.stopped == "early stop" and result.best_step == 0 and result.steps < 40
    assert result.backoffs == [2]  # the first evaluation backed off, the second stopped
    assert len(calls) == 3 and calls[1] != pytest.approx(calls[0], rel=1e-6)  # the tensors did move
    assert all(torch.equal(a, b) for a, b in zip(before, student.parameters()))
    assert held_out_loss(student, teacher, t.val, 2) == pytest.approx(kl)
    assert all(p.requires_grad for p in student.parameters())  # as it came


@pytest.mark.slow
def test_the_originals_perplexities_are_measured_once_per_model_and_windows(compressed, original, monkeypatch):
    """The original's perplexities never change for its tensors and the windows: a second heal reads them back from
    the cache; other tensors or other windows are measured."""
    import gac
    from gac.checkpoint.loading import load_model
    from gac.heal.texts import HealTexts

    teacher = load_model(str(original)).model
    t = heal_windows(gac.load(compressed).tokenizer, heal_file=None, eval_file=None, unlike_file=None, seq_len=32,
                     eval_windows=2)
    first = t.cached_perplexities(teacher, progress=False)
    assert first == t.perplexities(teacher, progress=False)
    measured = []
    measure = HealTexts.perplexities
    monkeypatch.setattr(HealTexts, "perplexities", lambda self, *a, **k: measured.append(1) or measure(self, *a, **k))
    assert t.cached_perplexities(teacher, progress=False) == first and not measured
    fewer = heal_windows(gac.load(compressed).tokenizer, heal_file=None, eval_file=None, unlike_file=None,
                         seq_len=32, eval_windows=1)
    assert fewer.cached_perplexities(teacher, progress=False) != first and len(measured) == 1
    with torch.no_grad():
        teacher.model.norm.weight.mul_(2)
    assert t.cached_perplexities(teacher, progress=False) != first and len(measured) == 2


def test_embeddings_and_head_are_not_trained(tiny):
    for which in ("all", "changed"):
        trained = {id(p) for p in trainable_parameters(tiny, tiny, which)}
        assert id(tiny.get_input_embeddings().weight) not in trained
        assert id(tiny.get_output_embeddings().weight) not in trained
    assert len({id(p) for p in trainable_parameters(tiny)}) == len(list(tiny.parameters())) - 1  # tied: one left out


def test_changed_trains_the_compressions_tensors_and_the_norms_only(compressed, original, docs_file):
    """--heal-train changed: the factor pairs and every vector train; the matrices the compression
    left as they were keep the original's values through a whole run, and the held-out loss still falls."""
    import gac
    from gac.checkpoint.loading import load_model

    loaded, teacher = gac.load(compressed), load_model(str(original)).model
    student, kept = loaded.model, dict(teacher.named_parameters())
    trained = {id(p) for p in trainable_parameters(student, teacher, "changed")}
    names = {n: p for n, p in student.named_parameters()}
    same = {n for n, p in names.items() if n in kept and kept[n].shape == p.shape and torch.equal(kept[n], p)}
    factors = {n for n in names if n not in kept}
    assert factors and same - {"model.embed_tokens.weight"}  # the tiny asvd output has both kinds
    assert all(id(names[n]) in trained for n in factors)
    assert all((id(names[n]) in trained) == (names[n].dim() == 1) for n in same - {"model.embed_tokens.weight"})
    t = heal_windows(loaded.tokenizer, heal_file=docs_file, eval_file=None, unlike_file=None, seq_len=32,
                     eval_windows=2)
    before = held_out_loss(student, teacher, t.val, 2)
    changed = dataclasses.replace(HEAL.distill, train="changed")
    result = distill(student, teacher, t.train, t.val, changed, progress=False)
    assert result.trainable_params == sum(names[n].numel() for n in names if id(names[n]) in trained)
    assert all(torch.equal(kept[n], names[n]) for n in same if names[n].dim() > 1)
    assert result.best_step > 0 and held_out_loss(student, teacher, t.val, 2) < 0.97 * before
    with pytest.raises(GacError, match="distill.train"):
        DistillConfig(train="factors")


def test_ce_weight_adds_the_texts_cross_entropy(compressed, original, docs_file):
    """--ce-weight W: the loss is the KL to the original plus W x the student's cross-entropy on each window's next
    tokens, in training and in the early-stopping loss alike; a run with it still lowers that loss."""
    import torch.nn.functional as F

    import gac
    from gac.checkpoint.loading import load_model
    from gac.heal.distill import distillation_loss

    loaded, teacher = gac.load(compressed), load_model(str(original)).model
    student = loaded.model
    t = heal_windows(loaded.tokenizer, heal_file=docs_file, eval_file=None, unlike_file=None, seq_len=32,
                     eval_windows=2)
    ids = t.val[:2]
    with torch.inference_mode():
        s_out, t_out = student(ids), teacher(ids)
        ce = float(F.cross_entropy(s_out.logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()))
        kl = float(distillation_loss(s_out, t_out, 0.0))
        assert float(distillation_loss(s_out, t_out, 0.0, ids, 0.5)) == pytest.approx(kl + 0.5 * ce, rel=1e-5)
        assert float(distillation_loss(s_out, s_out, 0.0, ids, 2.0)) == pytest.approx(2.0 * ce, rel=1e-5, abs=1e-6)
    assert held_out_loss(student, teacher, ids, 2, ce_weight=0.5) == pytest.approx(kl + 0.5 * ce, rel=1e-4)
    cfg = dataclasses.replace(HEAL.distill, ce_weight=0.5, precision="fp32")
    before = held_out_loss(student, teacher, t.val, 2, ce_weight=0.5)
    result = distill(student, teacher, t.train, t.val, cfg, progress=False)
    assert result.held_out_loss[0][1] == pytest.approx(before)
    assert result.best_step > 0 and held_out_loss(student, teacher, t.val, 2, ce_weight=0.5) < 0.97 * before
    with pytest.raises(GacError, match="distill.ce_weight"):
        DistillConfig(ce_weight=-1.0)


@pytest.mark.slow
def test_compress_with_heal(original, tmp_path):
    out = tmp_path / "out"
    result = compress(CompressConfig(model=str(original), compressor="svd", ratio=0.3, out=str(out), text=TEXT,
                                     evaluate=False, progress=False, heal=HEAL))
    h = result.report.heal
    assert h["ppl"]["after"]["held_out"] < h["ppl"]["before"]["held_out"]
    assert json.loads((out / "gac_plan.json").read_text())["healed"]["tokens"] == h["run"]["tokens"]
    assert "Healed by distillation" in (out / "report.md").read_text()
    _assert_heal_png(out / "heal.png")
    with pytest.raises(GacError, match="layer by layer"):
        CompressConfig(heal=HEAL, pipeline="layerwise")


@pytest.mark.slow
def test_a_failed_heal_leaves_no_output(compressed, tmp_path, monkeypatch):
    import importlib

    d = importlib.import_module("gac.heal.distill")  # the module (gac.heal.distill is also the function's name)

    def broken(*args, **kwargs):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(d, "distillation_loss", broken)
    with pytest.raises(RuntimeError):
        heal_dir(str(compressed), str(tmp_path / "out"), HEAL)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.subprocess
def test_cli_heals_and_prints_before_and_after(compressed, tmp_path):
    out = tmp_path / "out"
    p = run_gac("heal", compressed, "--out", out, "--heal-tokens", 32 * 2 * 6, "--seq-len", 32, "--eval-windows", 2,
                "--heal-train", "changed", "--ce-weight", 0.25, "--quiet")
    assert p.returncode == 0, p.stderr
    assert "perplexity on held-out Python docs" in p.stdout and "Python licence" in p.stdout
    report = json.loads((out / "heal.json").read_text())
    run = report["run"]
    assert f"at peak lr {run['lr']:.2g}," in p.stdout and run["lr"] > 0
    assert report["config"]["train"] == "changed" and run["trainable_params"] < report["params"] / 2
    assert report["config"]["ce_weight"] == 0.25 and "KL + 0.25 x cross-entropy" in p.stdout


def _moved_original(compressed, tmp_path):
    """A copy of the output whose plan names an original that is not there."""
    moved = tmp_path / "moved"
    shutil.copytree(compressed, moved)
    plan = json.loads((moved / "gac_plan.json").read_text())
    (moved / "gac_plan.json").write_text(json.dumps({**plan, "source_model": str(tmp_path / "gone")}))
    return moved


BAD_INPUT = {  # case -> (arguments after MODEL, expected in the error); MODEL is the compressed output unless named
    "not a gac output": (lambda c, o, t: [o], "not a gac output"),
    "missing original": (lambda c, o, t: [_moved_original(c, t)], "is not found"),
    "empty text": (lambda c, o, t: [c, "--heal-file", _text(t, "  \n")], "empty"),
    "tiny text": (lambda c, o, t: [c, "--heal-file", _text(t, "a few words only")], "healing text"),
    "zero tokens": (lambda c, o, t: [c, "--heal-tokens", 0], "--heal-tokens"),
    "negative ce weight": (lambda c, o, t: [c, "--ce-weight", -1], "--ce-weight"),
    "too few samples": (lambda c, o, t: [c, "--heal-samples", 2], "--heal-samples"),
}


def _text(tmp_path, content):
    path = tmp_path / "text.txt"
    path.write_text(content)
    return path


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_cli_refuses_bad_input(case, compressed, original, tmp_path):
    args, expected = BAD_INPUT[case]
    out = tmp_path / "out"
    assert_one_error_line(gac_cli("heal", *args(compressed, original, tmp_path), "--out", out), expected)
    assert not out.exists()


def test_heal_options_need_heal(tmp_path):
    assert_one_error_line(gac_cli("compress", "--out", tmp_path / "out", "--heal-tokens", 100), "give --heal")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_healing_lowers_the_loss_in_either_precision(compressed, original, docs_file, precision):
    """bf16 matmuls (autocast; weights, optimizer and loss in fp32) heal as fp32 does, and the run says which ran."""
    import gac
    from gac.checkpoint.loading import load_model

    loaded, teacher = gac.load(compressed), load_model(str(original)).model
    t = heal_windows(loaded.tokenizer, heal_file=docs_file, eval_file=None, unlike_file=None, seq_len=32,
                     eval_windows=2)
    before = held_out_loss(loaded.model, teacher, t.val, 2)
    result = distill(loaded.model, teacher, t.train, t.val,
                     DistillConfig(tokens=32 * 2 * 48, lr=3e-3, eval_every=6, patience=3, precision=precision,
                                   ce_weight=0.0),
                     progress=False)
    assert result.precision == {"fp32": "float32", "bf16": "bfloat16"}[precision]
    assert all(p.dtype == torch.float32 for p in loaded.model.parameters())  # the weights stay fp32
    assert result.best_step > 0 and held_out_loss(loaded.model, teacher, t.val, 2) < 0.97 * before


def test_healing_in_fp32_on_a_cpu_without_bf16_says_so(compressed, original, docs_file, monkeypatch, caplog):
    """Where auto resolves to fp32 on a CPU (no AVX512-BF16, no AMX), the user is told why healing is slow; a
    precision they chose themselves is not remarked on."""
    import gac
    from gac.checkpoint.loading import load_model

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    loaded, teacher = gac.load(compressed), load_model(str(original)).model
    t = heal_windows(loaded.tokenizer, heal_file=docs_file, eval_file=None, unlike_file=None, seq_len=32,
                     eval_windows=2)
    for precision, said in (("auto", True), ("fp32", False)):
        caplog.clear()
        with caplog.at_level("INFO", logger="gac.heal.distill"):
            result = distill(loaded.model, teacher, t.train, t.val,
                             DistillConfig(tokens=32 * 2 * 2, precision=precision), progress=False)
        assert result.precision == "float32"
        assert ("no native bf16" in caplog.text) == said


def test_auto_precision_is_bf16_only_where_native():
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert DistillConfig().compute_dtype("cpu") == (torch.bfloat16 if native else torch.float32)
    assert DistillConfig(precision="fp32").compute_dtype("cpu") == torch.float32
    with pytest.raises(GacError, match="distill.precision"):
        DistillConfig(precision="fp16")


def test_cli_choices_are_the_configs():
    from gac.cli.heal import PRECISIONS, TRAINED
    from gac.heal.distill import PRECISIONS as CONFIG_PRECISIONS
    from gac.heal.distill import TRAINED as CONFIG_TRAINED

    assert PRECISIONS == CONFIG_PRECISIONS and TRAINED == CONFIG_TRAINED


def test_a_learning_rate_that_overshoots_backs_off_and_then_heals(compressed, original, docs_file):
    """An lr far too high makes the first evaluation worse: the best tensors come back at a lower lr (times
    `backoff`), which then heals."""
    import gac
    from gac.checkpoint.loading import load_model

    loaded, teacher = gac.load(compressed), load_model(str(original)).model
    t = heal_windows(loaded.tokenizer, heal_file=docs_file, eval_file=None, unlike_file=None, seq_len=32,
                     eval_windows=2)
    before = held_out_loss(loaded.model, teacher, t.val, 2)
    result = distill(loaded.model, teacher, t.train, t.val,
                     DistillConfig(tokens=32 * 2 * 30, lr=0.5, backoff=0.006, eval_every=3, patience=2, warmup=0.0,
                                   ce_weight=0.0), progress=False)
    assert result.backoffs[0] == 3 and dict(result.held_out_loss)[3] > before  # overshot, then backed off
    assert result.best_step > result.backoffs[0] and held_out_loss(loaded.model, teacher, t.val, 2) < 0.97 * before


@pytest.mark.slow
def test_sampled_windows_come_from_the_original_and_never_repeat_the_evaluation_text(compressed, original):
    import gac
    from gac.checkpoint.loading import load_model
    from gac.heal.samples import sample_windows

    teacher = load_model(str(original)).model
    drawn = sample_windows(teacher, 5, 64, seed=0, progress=False)  # 64: two OVERLAP_TOKENS runs a window
    assert drawn.shape == (5, 64) and drawn.dtype == torch.long
    assert 0 <= int(drawn.min()) and int(drawn.max()) < teacher.config.vocab_size
    assert torch.equal(drawn, sample_windows(teacher, 5, 64, seed=0, progress=False))  # the seed decides
    assert not torch.equal(drawn, sample_windows(teacher, 5, 64, seed=1, progress=False))
    t = heal_windows(gac.load(compressed).tokenizer, heal_file=None, eval_file=None, unlike_file=None, seq_len=64,
                     eval_windows=2)
    drawn = torch.cat([drawn, t.held_out[:1]])  # a "sample" repeating an evaluation window
    mixed = t.with_samples(drawn)
    assert mixed.sampled == 3 and mixed.dropped == t.dropped + 1  # 6 drawn, one dropped, 2 for early stopping
    assert torch.equal(mixed.train, torch.cat([t.train, drawn[:3]])) and torch.equal(mixed.val[-2:], drawn[3:5])
    assert "3 windows sampled from the original" in mixed.names["train"]
    assert not sharing(mixed.train, list(t.evaluated().values())).any()


@pytest.mark.slow
def test_healing_on_samples_beside_the_text(compressed, tmp_path):
    """--heal-samples: windows sampled from the original join the training and early-stopping windows, and the
    KL on both falls."""
    # twice HEAL's budget: on the KL alone the tiny model's held-out loss is still falling at 24 steps
    kl_only = dataclasses.replace(HEAL.distill, ce_weight=0.0, tokens=2 * HEAL.distill.tokens)
    healed = heal_dir(str(compressed), str(tmp_path / "out"), dataclasses.replace(HEAL, samples=10, distill=kl_only))
    texts, run = healed.report["texts"], healed.report["run"]
    assert texts["sampled_windows"] == 8 and texts["val_windows"] == 4 and texts["sampling_seconds"] >= 0
    assert "8 windows sampled from the original" in texts["train"]
    losses = dict(run["held_out_loss"])
    assert run["best_step"] > 0 and losses[run["best_step"]] < 0.97 * losses[0]


def test_unlike_texts_are_those_the_distribution_carries(monkeypatch, tmp_path):
    """The licence is required (refused in one line without it); IDLE's release notes are taken where installed."""
    import sysconfig

    from gac.calibration import texts as data

    assert "Python Software Foundation" in data.unlike_texts()["licence"][1]
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    with pytest.raises(GacError, match="with unlike_file"):
        data.unlike_texts()
    (tmp_path / "LICENSE.txt").write_text("licence")
    assert list(data.unlike_texts()) == ["licence"]
    (tmp_path / "idlelib").mkdir()
    (tmp_path / "idlelib" / "NEWS.txt").write_text("notes")
    assert {k: text for k, (_, text) in data.unlike_texts().items()} == {"licence": "licence", "release_notes": "notes"}


def test_the_help_states_the_configs_defaults():
    """The CLI spells the defaults in its help (parsing imports no torch); they must be DistillConfig's."""
    from gac.cli.heal import HEAL_OPTIONS

    helps = {}
    for option in HEAL_OPTIONS:
        param = option(lambda: None).__click_params__[0]
        helps[param.opts[0]] = param.help
    cfg = DistillConfig()
    assert f"[default: {cfg.tokens}: {cfg.steps(512)} steps of {cfg.batch} x 512 tokens]" in helps["--heal-tokens"]
    assert f"[default: {cfg.ce_weight};" in helps["--ce-weight"]
    assert float(helps["--heal-lr"].split("[default: ")[1].split("]")[0]) == cfg.lr
