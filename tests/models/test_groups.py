"""Dimension groups, the one surgery and the saved structure on tiny Llama and Phi models."""

import copy

import pytest
import torch

from gac.errors import GacError
from gac.models import surgery
from gac.models.adapters import adapter_for
from gac.models.groups import HeadGroup, HeadRankGroup, RankGroup, WidthGroup, compressed_dims_of, groups_of, linears_of
from gac.models.modeling_gac import GroupedLowRankLinear, LowRankLinear, apply_gac_structure
from gac.models.structure import structure_of
from tests.helpers_tiny import TINY, tiny_model

H, I, L = TINY["hidden_size"], TINY["intermediate_size"], TINY["num_hidden_layers"]
HEADS, KV = TINY["num_attention_heads"], TINY["num_key_value_heads"]
HD = H // HEADS


def _logits(model, ids):
    with torch.inference_mode():
        return model(ids, use_cache=False).logits.double()


def _close(a, b, rel=1e-5):
    """Equal up to fp32 reassociation, scaled by the magnitude of the values."""
    assert float((a - b).abs().max()) <= rel * float(b.abs().max())


IDS = torch.randint(0, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("family", ["llama", "phi"])
def test_groups_cover_every_linear_with_its_parameter_count(family):
    model = tiny_model(family)
    names = adapter_for(model.config).linear_names(model.config)
    ranks = groups_of(model, "rank")
    assert [g.linear for g in ranks] == names and all(isinstance(g, RankGroup) and g.dim is None for g in ranks)
    assert all(g.numel == model.get_submodule(g.linear).weight.numel() for g in ranks)
    assert all(g.params(g.max_dim) < g.numel <= g.params(g.max_dim + 1) for g in ranks)  # break-even rank
    mlps = groups_of(model, "mlp")
    assert len(mlps) == L and all(isinstance(g, WidthGroup) and g.dim == g.full == I for g in mlps)
    members = 3 if family == "llama" else 2  # gate, up, down / fc1, fc2
    assert all(len(g.linears) == members and g.params_per_dim == members * H for g in mlps)
    assert all(g.numel == sum(model.get_submodule(n).weight.numel() for n in g.linears) for g in mlps)
    heads = groups_of(model, "heads")
    assert all(isinstance(g, HeadGroup) and g.dim == g.max_dim == KV * HD and g.step == HD for g in heads)
    assert all(g.numel == sum(model.get_submodule(n).weight.numel() for n in g.linears) for g in heads)
    uniform = groups_of(model, "heads", mode="uniform")
    assert all(g.params(g.max_dim) == g.numel and g.step == KV * HD for g in uniform)
    head_ranks = groups_of(model, "head_rank", heads_per_group=1)
    assert len(head_ranks) == 2 * L * KV and all(isinstance(g, HeadRankGroup) for g in head_ranks)
    assert linears_of(head_ranks) == [n for n in names if n.endswith(("k_proj", "v_proj"))]
    assert compressed_dims_of(model) == []


def test_bad_requests_are_clear():
    model = tiny_model()
    with pytest.raises(GacError, match="does not divide"):
        groups_of(model, "head_rank", heads_per_group=3)
    with pytest.raises(GacError, match="layer 9 does not exist"):
        groups_of(model, "mlp", layers=[9])
    with pytest.raises(GacError, match="not valid"):
        groups_of(model, "heads")[0].check(HD + 1)


@pytest.mark.parametrize("family", ["llama", "phi"])
def test_keep_channels_and_heads_equal_masking(family):
    """Slicing the kept channels/heads equals zeroing the removed ones in the original (biases of the removed
    rows zeroed too), so the cut is exactly the function the compressor chose."""
    model = tiny_model(family, seed=2)
    mlp, attn = groups_of(model, "mlp")[0], groups_of(model, "heads")[0]
    keep = torch.arange(0, I, 3)  # every third channel
    kv_keep = torch.tensor([1])
    q_keep = (kv_keep[:, None] * (HEADS // KV) + torch.arange(HEADS // KV)).reshape(-1)
    cut = copy.deepcopy(model)
    surgery.apply(cut, [(mlp, surgery.Keep(keep)), (attn, surgery.KeepHeads(q_keep, kv_keep))])
    masked = copy.deepcopy(model)
    drop = torch.ones(I, dtype=torch.bool)
    drop[keep] = False
    with torch.no_grad():
        for n in mlp.producers:
            lin = masked.get_submodule(n)
            lin.weight[drop] = 0
            if lin.bias is not None:
                lin.bias[drop] = 0
        for n in mlp.consumers:
            masked.get_submodule(n).weight[:, drop] = 0
        q_drop = torch.ones(HEADS * HD, dtype=torch.bool)
        q_drop[surgery.channels_of(q_keep, HD)] = False
        masked.get_submodule(attn.o).weight[:, q_drop] = 0  # removed heads contribute nothing
    assert cut.get_submodule(mlp.producers[0]).weight.shape == (len(keep), H)
    assert cut.get_submodule(attn.k).weight.shape == (HD, H)
    assert groups_of(cut, "mlp")[0].dim == len(keep) and groups_of(cut, "heads")[0].dim == HD
    _close(_logits(cut, IDS), _logits(masked, IDS))
    assert sorted(compressed_dims_of(cut)) == sorted([len(keep), len(q_keep) * HD, HD])


@pytest.mark.parametrize("family", ["llama", "phi"])
def test_factorize_then_pad_is_the_same_function(family):
    model = tiny_model(family, seed=4)
    ranks = groups_of(model, "rank")
    cuts = []
    for k, g in enumerate(ranks):
        W = model.get_submodule(g.linear).weight.detach()
        U, S, Vh = torch.linalg.svd(W, full_matrices=False)
        r = 3 + k % 4
        cuts.append((g, surgery.Factors(Vh[:r], U[:, :r] * S[:r])))
    surgery.apply(model, cuts)
    live = groups_of(model, "rank")
    assert [g.dim for g in live] == [3 + k % 4 for k in range(len(ranks))]
    before = _logits(model, IDS)
    mlps = groups_of(model, "mlp")
    surgery.pad(model, [(g, 8) for g in live] + [(g, g.dim + 5) for g in mlps])
    assert all(g.dim == 8 for g in groups_of(model, "rank"))
    assert all(g.dim == I + 5 for g in groups_of(model, "mlp"))
    _close(_logits(model, IDS), before)


def test_head_rank_groups_factorize_and_pad_together():
    model = tiny_model(seed=5)
    groups = groups_of(model, "head_rank", heads_per_group=1)
    cuts = []
    for g in groups:
        W = model.get_submodule(g.linear).weight.detach()[g.row0:g.row0 + g.out_features]
        U, S, Vh = torch.linalg.svd(W, full_matrices=False)
        r = 2 + g.group
        cuts.append((g, surgery.Factors(Vh[:r], U[:, :r] * S[:r])))
    surgery.apply(model, cuts)
    k0 = model.get_submodule(groups[0].linear)
    assert isinstance(k0, GroupedLowRankLinear) and k0.ranks == [2 + g for g in range(KV)]
    before = _logits(model, IDS)
    live = groups_of(model, "head_rank", heads_per_group=1)
    assert [g.dim for g in live] == [2 + g.group for g in groups]
    surgery.pad(model, [(g, 8) for g in live])
    assert model.get_submodule(groups[0].linear).ranks == [8] * KV
    _close(_logits(model, IDS), before)


def test_head_rank_groups_of_one_linear_are_cut_all_or_none():
    """They share one down-projection: a cut of some of them would build a projection with fewer rows."""
    model = tiny_model(seed=5)
    groups = groups_of(model, "head_rank", heads_per_group=1)
    assert all(g.groups_per_linear == KV for g in groups)
    with pytest.raises(GacError, match=f"1 of its {KV} head groups"):
        surgery.apply(model, [(groups[0], surgery.Factors(torch.randn(2, H), torch.randn(HD, 2)))])
    assert isinstance(model.get_submodule(groups[0].linear), torch.nn.Linear)  # left as it was


def test_attention_heads_are_not_padded():
    model = tiny_model()
    heads = groups_of(model, "heads")[0]
    with pytest.raises(TypeError, match="cannot be zero-padded exactly"):
        surgery.pad(model, [(heads, heads.dim + HD)])


@pytest.mark.parametrize("family", ["llama", "phi"])
def test_structure_round_trip(family):
    """structure_of reads every kind off a live model; applying it to a fresh model rebuilds the same shapes."""
    model = tiny_model(family, seed=6)
    mlp0, attn0 = groups_of(model, "mlp", layers=[0])[0], groups_of(model, "heads", layers=[0])[0]
    surgery.apply(model, [(mlp0, surgery.Keep(torch.arange(37))),
                          (attn0, surgery.KeepHeads(torch.arange(HEADS // KV), torch.tensor([0])))])
    rank1 = groups_of(model, "rank", layers=[1])
    q1 = next(g for g in rank1 if g.linear.endswith("q_proj"))
    surgery.apply(model, [(q1, surgery.Factors(torch.randn(5, H), torch.randn(H, 5)))])
    kv1 = [g for g in groups_of(model, "head_rank", layers=[1]) if g.linear.endswith("k_proj")]
    surgery.apply(model, [(g, surgery.Factors(torch.randn(3, H), torch.randn(HD, 3))) for g in kv1])
    structure = structure_of(model)
    assert set(structure) == {"linear", "attention", "lowrank", "grouped_lowrank"}
    assert structure["lowrank"] == {q1.linear: 5} and structure["grouped_lowrank"] == {kv1[0].linear: [3] * KV}
    assert structure["attention"] == {attn0.block: {"num_heads": HEADS // KV, "num_kv_heads": 1}}
    assert structure["linear"][mlp0.consumers[0]] == [H, 37]
    fresh = tiny_model(family, seed=7)
    apply_gac_structure(fresh, structure)
    assert {n: p.shape for n, p in fresh.state_dict().items()} == {n: p.shape for n, p in model.state_dict().items()}
    fresh.load_state_dict(model.state_dict())
    _close(_logits(fresh, IDS), _logits(model, IDS))
    assert isinstance(fresh.get_submodule(q1.linear), LowRankLinear)


def test_the_kinds_names_are_the_registered_kinds():
    """KINDS (torch-free: the deployment targets name them) lists KIND_TYPES' kinds, in its order."""
    from gac.models.groups import KIND_TYPES
    from gac.models.kinds import KINDS

    assert tuple(KIND_TYPES) == KINDS
