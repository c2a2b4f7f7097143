"""What the llama.cpp export tests share: a GGUF's logits in llama.cpp against gac's own, and pruned variants of one
model (prune's own widths, GAC's under each deployment target) from one analysis."""

from __future__ import annotations

import copy

import numpy as np
import torch

MAX_REL_ERROR = 1e-2  # f16 weights vs gac's fp32: measured 2.1e-3 on the embedded model (results/llama-cpp-gguf.md)


def gac_logits(model, tokens):
    with torch.inference_mode():
        return model(torch.tensor([tokens]), use_cache=False).logits[0].float().numpy()  # [S, V]


def round_trip(path, model, tokens):
    """(max relative logit error, argmax agreement) of the GGUF at `path` run in llama.cpp against `model` in gac."""
    from gac.export.engine import logits, open_gguf

    with open_gguf(path, logits_all=True) as llm:
        got = logits(llm, tokens)  # [S, V]
    ref = gac_logits(model, tokens)
    rel = float(np.abs(got - ref).max() / np.abs(ref).max())
    same = float((got.argmax(-1) == ref.argmax(-1)).mean())
    return rel, same


def pruned_variants(model, calib, *, ratio: float, targets: tuple[str, ...], layers="all") -> dict:
    """{"unaligned": model, "gac:<target>": model, ...}: prune's own widths, and GAC's under each deployment
    target, the same budget and the same analysis (calibrated once)."""
    from gac.align.targets import get_target
    from gac.api import CompressConfig
    from gac.calibration.texts import TextConfig
    from gac.objectives import select_dims
    from gac.objectives.parameter import select_within_budget
    from gac.pipelines.whole_model import analyze

    cfg = CompressConfig(compressor="prune", ratio=ratio, target=targets[0], progress=False,
                         compressor_options={"layers": layers}, text=TextConfig(seq_len=calib.shape[1]))
    sel = select_dims(model, analyze(model, calib, cfg), cfg)
    dims = {"unaligned": sel.dims["unaligned"]}
    for t in targets:
        chosen = select_within_budget(sel.units, sel.dims["unaligned"], sel.budget, alignment=8, window=1,
                                      candidates_for=get_target(t).candidates_for(8))
        dims[f"gac:{t}"] = {**sel.dims["unaligned"], **chosen.dims}
    out = {}
    for name, d in dims.items():
        m = copy.deepcopy(model)
        sel.compressor.materialize(m, sel.units, d)
        out[name] = m.eval()
    return out
