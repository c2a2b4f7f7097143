"""Fixtures of the export tests: pruned variants of small models."""

from __future__ import annotations

import copy


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
