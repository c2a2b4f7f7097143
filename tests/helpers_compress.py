"""Compressing at test sizes: the library's config on few short windows and short timings, `gac compress`'s options
at the same sizes, and a tiny model calibrated and analyzed by the prune compressor."""

from __future__ import annotations

import torch

from gac.api import CompressConfig
from gac.calibration.texts import TextConfig
from gac.evaluate.latency import LatencyConfig
from tests.helpers_tiny import tiny_model

FAST_TEXT = TextConfig(seq_len=32, calib_windows=4, eval_windows=2)
FAST_LATENCY = LatencyConfig(prefill_tokens=16, decode_context=8, warmup=1, prefill_rounds=2, decode_rounds=3)


def fast_config(model, **kw):
    return CompressConfig(model=str(model), text=FAST_TEXT, latency=FAST_LATENCY, progress=False, **kw)


FAST_ARGS = ["--seq-len", "32", "--calib-windows", "4", "--eval-windows", "2", "--prefill-tokens", "16", "--quiet"]


def random_windows(vocab, n=4, seq=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, seq), generator=g)  # [n, seq]


def prune_setup(model_type="llama", importance="magnitude", head_mode="group", layers="all"):
    """A tiny model of `model_type` calibrated on random windows and analyzed by prune: (model, its linears' names,
    the windows, the compressor, its units)."""
    from gac.calibration.stats import calibrate
    from gac.compressors import make_compressor
    from gac.models.adapters import adapter_for

    model = tiny_model(model_type)
    names = adapter_for(model.config).linear_names(model.config)
    windows = random_windows(model.config.vocab_size)
    stats = calibrate(model, windows, names, batch_size=2, progress=False)
    comp = make_compressor("prune", importance=importance, head_mode=head_mode, layers=layers)
    units = comp.analyze(model, comp.groups(model), stats, windows=windows, progress=False)
    return model, names, windows, comp, units
