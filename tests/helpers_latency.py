"""The latency objective's stand-in instruments: latency tables that grow with the dim, a timer whose built models
fall short of the target once and then reach it, and the objective at test sizes measured through them
(gac.objectives.latency.config.Instruments)."""

from __future__ import annotations

from gac.objectives.latency.config import Instruments, SpeedupConfig


def linear_latency(groups, phase, *, alignment=8, **_):
    """A latency model whose op times grow with the dim, so any target below the groups' share is reachable."""
    from gac.objectives.latency.model import LatencyModel, build_tables, sweep_needs

    per_dim = {"gemm_k": 0.0001}  # a cheap up-projection, so that PaLU's groups can be faster than the dense share
    op_tables = {key: {d: per_dim.get(key[0], 0.01) * d for d in dims}
                 for key, dims in sweep_needs(groups, alignment).items()}
    full_dims = {g.name: g.full_dim for g in groups if g.full_dim is not None}  # as measure_latency_model keys them
    return LatencyModel(phase, *build_tables(groups, alignment, op_tables), full_dims=full_dims)


BASE_MS = 2.0


class ShortThenReached:
    """Timer stand-in: the baseline at 2 ms (its A/A twin at `aa` times that: 2.02), each built model (the knapsack's,
    "latency", and the guard's, "parameter") 5% short of the target on its first timing and 1% under it afterwards,
    so that each stream's closed loop must tighten once. `factors` {stream: {call: factor}} overrides a stream's
    schedule. `seen` lists every (name, model) it timed."""

    def __init__(self, factors=None, aa=1.01):
        from collections import Counter

        self.calls = Counter()
        self.factors = factors or {}
        self.aa = aa
        self.seen = []

    def factor(self, name, call):
        return self.factors.get(name, {}).get(call, self.factors.get(name, {}).get("else", 1.05 if call == 1 else
                                                                                     0.99))

    def __call__(self, models, cfg, aa=True):
        from gac.hw.timing import Timing

        def t(ms):
            return Timing(ms, ms, ms, ms, 1)

        out = {"baseline": t(BASE_MS)}
        for name, model in models.items():
            if name != "baseline":
                self.calls[name] += 1
                self.seen.append((name, model))
                out[name] = t(BASE_MS / cfg.speedup * self.factor(name, self.calls[name]))
        if aa:
            out["baseline (A/A)"] = t(BASE_MS * self.aa)
        return out


# margin 0: the loop's mechanics against the target itself (tests/objectives/test_latency.py's
# test_the_loop_aims_at_the_target_and_its_margin: with one)
FAST = {"seq": 16, "timing_rounds": 3, "profile_repeats": 3, "rounds": 2, "halvings": 0, "gate_band": 0.0,
        "margin": 0.0, "line_rounds": 0}


def objective(timer=None, loss=None, speedup=1.05, **kw) -> SpeedupConfig:
    """The latency objective at FAST (kw overrides) on the linear latency tables, timed by `timer` (None: the real
    timer) and the guard's loss from `loss` (None: the real one)."""
    instruments = Instruments(latency_model=linear_latency, loss=loss, **({"timer": timer} if timer else {}))
    return SpeedupConfig(speedup, **{**FAST, **kw}, instruments=instruments)
