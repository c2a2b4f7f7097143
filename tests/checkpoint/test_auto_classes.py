"""gac.register(): gac's model types in transformers' Auto classes explicitly, at once and idempotently, without
the import hook that `import gac` installs."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gac.checkpoint import gac_dir
from gac.checkpoint.gac_dir import plan_record, save
from tests.helpers_tiny import tiny_model, tiny_tokenizer


@pytest.mark.subprocess
def test_register_alone_lets_transformers_load_a_gac_output(tmp_path):
    """With the hook taken out, transformers refuses the directory; after gac.register() (twice: idempotent, one
    entry a class) AutoModelForCausalLM.from_pretrained builds gac's own class, computing what was saved."""
    model = tiny_model()
    d = save(model, tiny_tokenizer(), tmp_path / "out", plan=plan_record(
        variant="unaligned", source_model="tiny", alignment=None, dims={}))
    ids = torch.arange(12).reshape(1, 12)
    with torch.inference_mode():
        torch.save({"ids": ids, "logits": model(ids).logits}, tmp_path / "ref.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        import gac
        from gac.checkpoint.auto_classes import _AfterImport
        from gac.models.adapters import FAMILIES
        hooks = [f for f in sys.meta_path if isinstance(f, _AfterImport)]
        if len(hooks) != 1:
            sys.exit(f"import gac installed {{len(hooks)}} hooks")
        sys.meta_path.remove(hooks[0])  # the explicit call alone
        from transformers import AutoModelForCausalLM
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        try:
            AutoModelForCausalLM.from_pretrained({str(d)!r})
            sys.exit("transformers loaded a gac output before gac.register()")
        except ValueError:
            pass
        gac.register()
        mappings = (CONFIG_MAPPING, AutoModelForCausalLM._model_mapping)  # what AutoConfig / .register() add to
        configs, models = (dict(m._extra_content) for m in mappings)
        gac.register()
        if (configs, models) != tuple(dict(m._extra_content) for m in mappings):
            sys.exit("a second gac.register() changed the registrations")
        if len(models) != len(FAMILIES) or not all(t.startswith("gac_") for t in configs):
            sys.exit(f"registered {{sorted(configs)}}")
        model = AutoModelForCausalLM.from_pretrained({str(d)!r}).eval()
        if type(model).__module__ != "gac.models.modeling_gac" or type(model).__name__ != "GacLlamaForCausalLM":
            sys.exit(f"built {{type(model).__module__}}.{{type(model).__name__}}")
        ref = torch.load({str(tmp_path / "ref.pt")!r})
        with torch.inference_mode():
            diff = (model(ref["ids"]).logits - ref["logits"]).abs().max().item()
        if diff > 1e-6:
            sys.exit(f"logits differ by {{diff}}")
    """)
    src = Path(gac_dir.__file__).parents[2]  # this gac, whatever the working directory
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "hf-modules"),
           "PYTHONPATH": str(src)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
