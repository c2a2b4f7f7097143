"""The memory forecast and `gac compress --dry-run`: from the config alone, growing with one layer, not with depth,
for the layer-by-layer pipeline (the choice of pipeline it feeds: test_choice.py)."""

from __future__ import annotations

import pytest
import transformers

from gac.calibration.importance import FISHER_SAMPLES
from gac.errors import GacError
from gac.pipelines.memory import (FP64_SHARE, GRAM32_SHARE, SVD_SHARE, Shapes, factorization_cost, forecast,
                                 loss_model_flops)
from tests.helpers import gac_cli
from tests.helpers_forecast import DOCS, RATE, llama


def test_shapes_count_llama_3_8b_parameters():
    config = transformers.AutoConfig.from_pretrained(DOCS / "llama-3-8b")
    assert Shapes.of(config).params == pytest.approx(8.03e9, rel=0.01)  # Llama-3-8B has 8.03 B parameters


def test_layerwise_forecast_grows_with_one_layer_not_depth():
    shallow, deep = (forecast(llama(n), flops_per_s=RATE) for n in (4, 16))
    layer_bytes = 4 * Shapes.of(llama(1)).layer_params
    assert 0 <= deep.peak_bytes - shallow.peak_bytes < 2 * layer_bytes
    whole_shallow, whole_deep = (forecast(llama(n), pipeline="whole", flops_per_s=RATE) for n in (4, 16))
    assert whole_deep.peak_bytes - whole_shallow.peak_bytes > 12 * layer_bytes  # the whole model grows with depth
    assert deep.seconds > shallow.seconds > 0
    assert whole_deep.disk_bytes < 4 * Shapes.of(llama(16)).params  # the output is smaller than the fp32 model
    assert deep.disk_bytes > whole_deep.disk_bytes  # layer by layer, stored activations go to disk


def test_bfloat16_halves_the_weights():
    f32, bf16 = (forecast(llama(8), dtype=d, flops_per_s=RATE) for d in ("float32", "bfloat16"))
    assert bf16.weights_bytes * 2 == f32.weights_bytes
    assert bf16.disk_bytes < f32.disk_bytes


@pytest.mark.parametrize("name", ["llama-3-8b", "llama-3-70b", "qwen3-30b-a3b"])
def test_dry_run_prints_the_forecast(name):
    p = gac_cli("compress", "--model", str(DOCS / name), "--dtype", "bfloat16", "--layerwise", "--dry-run")
    assert p.returncode == 0, p.stderr
    for key in ("peak memory (cpu)", "disk needed", "rough time", "pipeline: layerwise"):
        assert key in p.stdout
    peak = float(next(x for x in p.stdout.splitlines() if x.startswith("peak memory")).split(":")[1].split()[0])
    weights = float(next(x for x in p.stdout.splitlines() if x.startswith("model weights")).split(":")[1].split()[0])
    assert peak < weights  # never holds the model


@pytest.mark.parametrize("args, match", [
    (["--max-memory", "cpu=lots", "--dry-run"], "max-memory size"),
    (["--max-memory", "gpu=1GiB", "--dry-run"], "max-memory device"),
    ([], "missing --out"),
])
def test_bad_memory_options_are_one_line(args, match):
    p = gac_cli("compress", "--model", str(DOCS / "llama-3-8b"), *args)
    assert p.returncode == 2
    assert match in p.stderr and len(p.stderr.strip().splitlines()) == 1


WORK = "SVD / loss model / whitening work (largest weight)"


def test_forecast_follows_the_compressor_not_its_name():
    """What is counted comes from the compressor the run builds: asvd with measured sensitivity (importance None)
    collects no X^T X and runs no loss model nor gradient pass, unlike its default ("output")."""
    config = llama(4)
    default, measured = (forecast(config, options=opts, pipeline="whole", flops_per_s=RATE)
                         for opts in ({}, {"importance": None}))
    assert default.parts["all X^T X"] > 0 and measured.parts["all X^T X"] == 0
    assert measured.parts[WORK] < default.parts[WORK]  # the SVD's work only: no float64 loss-model curve
    assert default.peak_bytes - measured.peak_bytes >= default.parts["all X^T X"]
    with pytest.raises(GacError, match="measured-sensitivity"):  # layer by layer it is refused, as the run refuses
        forecast(config, options={"importance": None}, flops_per_s=RATE)
    svd, asvd = (forecast(config, compressor=name, flops_per_s=RATE) for name in ("svd", "asvd"))
    assert svd.parts["one layer's X^T X"] == 0  # magnitude importance: no X^T X, a forward sweep
    assert svd.disk_bytes < asvd.disk_bytes  # no stored activations for a reverse sweep
    whitened = forecast(config, compressor="svd_llm", options={"importance": "magnitude"}, flops_per_s=RATE)
    assert whitened.parts["one layer's X^T X"] > 0 and whitened.parts[WORK] > svd.parts[WORK]  # its cut whitens


def test_layerwise_forecast_counts_the_factor_cache_and_one_svd():
    """Layer by layer, each weight's factors at the largest rank selection may ask for are cached on disk (in the
    working dtype; materialization frees each layer's as it writes the output) and each weight is factorized once:
    materialization runs no calibration pass and no SVD."""
    config = llama(4)
    s = Shapes.of(config)
    layer = sum(((o * i - 1) // (o + i)) * (o + i) for o, i in s.linears())  # cached values of one layer
    for dtype, b in (("float32", 4), ("bfloat16", 2)):
        layerwise, whole = (forecast(config, compressor="svd", dtype=dtype, pipeline=p, factorization="svd",
                                     flops_per_s=RATE) for p in ("layerwise", "whole"))
        assert layerwise.disk_bytes == max(whole.disk_bytes, s.layers * layer * b) + layer * b
    tokens = 16 * 512  # forecast's default windows
    forward = 2 * tokens * (s.params - s.outer_params) + 2 * tokens * s.vocab * s.hidden
    svd = s.layers * sum(12 * o * i * min(o, i) for o, i in s.linears())
    svd_seconds = svd / (RATE * SVD_SHARE)  # the magnitude proxy: no loss model, no X^T X
    assert layerwise.seconds == pytest.approx(forward / RATE + svd_seconds)  # one forward sweep, one SVD per weight
    assert whole.seconds == pytest.approx(2 * forward / RATE + svd_seconds)
    layerwise, whole = (forecast(config, compressor="prune", pipeline=p, flops_per_s=RATE)
                        for p in ("layerwise", "whole"))
    assert layerwise.disk_bytes - whole.disk_bytes == s.layers * tokens * s.hidden * 4  # stored inputs, no factors


def test_gram32_forecast_counts_its_products_and_eigh_and_whitened_weights_take_the_svd():
    """The float32 Gram path (the CPU default): the Gram matrix and A V (2 max(o, i) k^2 each) and eigh (11 k^3) at
    GRAM32_SHARE, under LAPACK's SVD at Llama-3-8B's shapes; svd_llm's whitened weights always take the exact SVD."""
    config = llama(4)
    s = Shapes.of(config)
    svd, gram = (forecast(config, compressor="svd", factorization=m, flops_per_s=RATE) for m in ("svd", "gram32"))
    work = s.layers * sum(4 * max(o, i) * min(o, i) ** 2 + 11 * min(o, i) ** 3 for o, i in s.linears())
    lapack = s.layers * sum(12 * o * i * min(o, i) for o, i in s.linears())
    assert svd.seconds - gram.seconds == pytest.approx(lapack / (RATE * SVD_SHARE) - work / (RATE * GRAM32_SHARE))
    big = [factorization_cost(o, i, m) for o, i in ((4096, 4096), (14336, 4096)) for m in ("svd", "gram32")]
    assert all(f_svd / s_svd > f_gram / s_gram for (f_svd, s_svd), (f_gram, s_gram) in zip(big[::2], big[1::2]))
    whitened = [forecast(config, compressor="svd_llm", options={"importance": "magnitude"}, factorization=m,
                         flops_per_s=RATE).seconds for m in ("svd", "gram32")]
    assert whitened[0] == whitened[1]


def test_loss_model_time_counts_its_float64_products_from_the_input_rows():
    """The loss model's Q comes from the input rows while they are fewer than the input's columns
    (gac.calibration.gram.Gram): fewer calibration tokens make it cheaper, and X^T X is summed only past that point."""
    assert loss_model_flops(4096, 14336, 1024) < loss_model_flops(4096, 14336, 8192) < loss_model_flops(4096, 14336, 10**6)
    assert loss_model_flops(4096, 14336, 14336) == loss_model_flops(4096, 14336, 10**6)  # the matrix from then on
    config = llama(4)
    s = Shapes.of(config)
    kw = dict(compressor="asvd", flops_per_s=RATE, calib_windows=1)
    plain, output = (forecast(config, options={"importance": imp}, seq_len=256, **kw) for imp in ("magnitude", "output"))
    loss = s.layers * sum(loss_model_flops(o, i, 256) for o, i in s.linears())
    passes = 1 + 1 + 2 * FISHER_SAMPLES  # the reverse sweep's: statistics, recompute, a backward per drawn label
    reverse = passes * 2 * 256 * ((s.params - s.outer_params) + s.vocab * s.hidden)
    assert output.seconds - plain.seconds == pytest.approx(loss / (RATE * FP64_SHARE) + reverse / RATE)


def test_x_t_x_memory_is_the_input_rows_while_they_are_fewer_than_the_columns():
    """gac.calibration.gram.Gram keeps the inputs' rows [tokens, in] (the model's dtype) while they are no more than the
    columns, and sums [in, in] in float64 past that: the forecast counts the same."""
    config = llama(2)  # inputs of width 1024 (hidden and q) and 3584 (intermediate)
    s = Shapes.of(config)
    widths = (s.hidden, s.q_width, s.intermediate)
    few = forecast(config, dtype="bfloat16", calib_windows=4, seq_len=128, flops_per_s=RATE)  # 512 tokens
    assert few.parts["one layer's X^T X"] == sum(2 * 512 * i for i in widths)
    many = forecast(config, dtype="bfloat16", calib_windows=16, seq_len=512, flops_per_s=RATE)  # 8192 tokens
    assert many.parts["one layer's X^T X"] == sum(8 * i * i for i in widths)


def test_auto_forecast_adds_a_second_built_candidate_on_the_whole_model():
    """`--compressor auto` builds two candidates (AUTO_BUILT): on the whole model its forecast is the heaviest
    candidate's plus the second one's built model copies and factors; layer by layer, the heaviest candidate's."""
    from gac.api import CompressConfig
    from gac.compressors import AUTO_CANDIDATES
    from gac.pipelines.memory import BUILT_COPY, FACTORS, forecast_of

    model = str(DOCS / "llama-3-8b")
    auto = CompressConfig(model=model, compressor="auto", ratio=0.15)
    singles = [forecast_of(CompressConfig(model=model, compressor=n, ratio=0.15), "whole") for n in AUTO_CANDIDATES]
    heaviest = max(singles, key=lambda f: f.peak_bytes)
    second = max((f for f in singles if f is not heaviest), key=lambda f: f.parts[BUILT_COPY] + f.parts[FACTORS])
    whole = forecast_of(auto, "whole")
    assert whole.peak_bytes == heaviest.peak_bytes + second.parts[BUILT_COPY] + second.parts[FACTORS]
    assert whole.peak_bytes > heaviest.peak_bytes
    assert forecast_of(auto, "layerwise").peak_bytes == max(
        forecast_of(CompressConfig(model=model, compressor=n, ratio=0.15), "layerwise").peak_bytes
        for n in AUTO_CANDIDATES)


def test_auto_forecast_times_every_analysis_and_the_built_factorized_again():
    """auto's time: the calibration and materialization passes and each kind of gradient pass once (the loss model's
    output gradients shared by the low-rank candidates, prune's taylor gradients its own), every candidate's own
    work, and the gac.compressors.AUTO_BUILT longest factorizations once more: more than any one candidate's run."""
    from gac.api import CompressConfig
    from gac.compressors import AUTO_BUILT
    from gac.compressors import AUTO_CANDIDATES
    from gac.pipelines.memory import FACTORIZING, forecast_of

    model = str(DOCS / "llama-3-8b")
    singles = {n: forecast_of(CompressConfig(model=model, compressor=n, ratio=0.15), "whole") for n in AUTO_CANDIDATES}
    auto = forecast_of(CompressConfig(model=model, compressor="auto", ratio=0.15), "whole")
    one = singles["prune"].pass_seconds["calibration pass"]  # no X^T X (the rate is measured once a process)
    statistics = singles["asvd"].pass_seconds["calibration pass"] - one  # X^T X, collected once for all
    assert statistics > 0
    assert auto.pass_seconds == pytest.approx({"calibration pass": one + statistics, "materialization pass": one,
                                               "gradient pass (output)": (1 + 2 * FISHER_SAMPLES) * one,
                                               "gradient pass (taylor)": 3 * one})
    own = sum(sum(f.work_seconds.values()) for f in singles.values())
    again = sum(sorted((f.work_seconds[FACTORIZING] for f in singles.values()), reverse=True)[:AUTO_BUILT])
    passes = 1 + 1 + (1 + 2 * FISHER_SAMPLES) + 3  # calibration, materialization, the two gradient passes
    assert again > 0 and auto.seconds == pytest.approx(passes * one + statistics + own + again)
    assert auto.seconds > max(f.seconds for f in singles.values())
