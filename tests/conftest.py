"""Shared fixtures: a tiny random Llama-family model with a real (tiny, trained-here) tokenizer, saved as an
HF directory, so every test runs offline in seconds."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys

# Set before torch loads libgomp (which llama.cpp's ggml shares): with OpenMP's default spin-waiting, torch and
# llama.cpp in one process (the export tests) made each other 5-10x slower on 2 busy cores; passive waits do not.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import pytest  # noqa: E402
import torch  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=320, max_position_embeddings=256, tie_word_embeddings=True)


# Gemma 3: its head_dim is not hidden / heads, its query scale is its own, half its layers see a sliding window
FAMILY_EXTRA = {"gemma3_text": dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                                    layer_types=["sliding_attention", "full_attention"])}


def tiny_tokenizer():
    """A byte-level BPE tokenizer trained on Python's docs, wrapped for transformers."""
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY["vocab_size"], special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = [topics[k] for k in sorted(topics)[:60]]
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def save_tiny(model, d, **save_options):
    """`model` and the tiny tokenizer saved as an HF model directory at `d` (save_options: save_pretrained's);
    returns `d`."""
    model.save_pretrained(d, **save_options)
    tiny_tokenizer().save_pretrained(d)
    return d


def tiny_model(model_type: str = "llama", seed: int = 0):
    import transformers

    config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                  "mistral": transformers.MistralConfig, "qwen3": transformers.Qwen3Config,
                  "granite": transformers.GraniteConfig, "olmo2": transformers.Olmo2Config,
                  "phi": transformers.PhiConfig, "gemma3_text": transformers.Gemma3TextConfig}[model_type]
    torch.manual_seed(seed)
    config = config_cls(**TINY, **FAMILY_EXTRA.get(model_type, {}))
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def installed_for_ci(module: str, package: str, setup_arg: str):
    """Import `module` (an engine the test set-up installs: `bash scripts/setup.sh llamacpp vllm`); where it is
    missing, fail under CI and skip elsewhere, so CI never passes by skipping."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{package} is not installed: CI's set-up is `bash scripts/setup.sh llamacpp vllm`")
        pytest.skip(f"{package} is not installed: bash scripts/setup.sh {setup_arg}")


@pytest.fixture(scope="session")
def llama_cpp():
    """llama-cpp-python (required under CI)."""
    return installed_for_ci("llama_cpp", "llama-cpp-python", "llamacpp")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Profiles, sweeps and perplexities that tests cache go to a temporary directory, never the user's ~/.cache/gac
    (for the whole session: module fixtures, set up before any function's, heal and profile too)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GAC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "gac-cache"))
        yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """An HF model directory (config, safetensors, tokenizer) of a tiny random Llama."""
    return save_tiny(tiny_model(), tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_phi_dir(tmp_path_factory):
    """An HF model directory of a tiny random Phi (dense/fc1/fc2 names, ungated MLP, biases everywhere)."""
    return save_tiny(tiny_model("phi"), tmp_path_factory.mktemp("tiny-phi"))


@pytest.fixture()
def tiny():
    """A fresh tiny random Llama model (eval mode)."""
    return tiny_model()


SLOW_MARKERS = ("integration", "vllm")

# The quick tier (`pytest -m quick`): a test is quick unless it asks for an engine's fixture (it is then marked
# `engine`) or is marked one of NOT_QUICK. That a quick test neither reads the embedded model nor starts a process is
# checked while it runs (quick_guard below), so a test that does either is marked `integration` or `subprocess`.
ENGINE_FIXTURES = ("vllm", "llama_cpp", "lm_eval")
NOT_QUICK = ("engine", "gpu", "integration", "slow", "subprocess", "vllm")


# Directories whose files share session fixtures (vLLM's served models, llama.cpp's exports): under pytest-xdist
# each runs on one worker, started first and in this order (the longest units); every other file runs whole on one
# worker (its module fixtures built once)
SHARED_UNITS = ("tests/serve", "tests/export")
MAX_WORKERS = 4  # past this, the two directories above bound the wall time and more workers only add memory


def work_unit(nodeid: str) -> str:
    """The unit pytest-xdist gives one worker: a directory above, else the test's file."""
    path = nodeid.split("::", 1)[0]
    directory = "/".join(path.split("/")[:2])
    return directory if directory in SHARED_UNITS else path


def tier_markers(marked: set[str], fixtures: set[str]) -> list[str]:
    """The markers collection adds to a test marked `marked` that asks for `fixtures`: every test on the embedded
    model or in vLLM is also `slow`, one asking for an engine fixture is `engine`, one marked none of NOT_QUICK
    then is `quick`."""
    added = ["slow"] if marked & set(SLOW_MARKERS) else []
    added += ["engine"] if fixtures & set(ENGINE_FIXTURES) else []
    return added + ([] if (marked | set(added)) & set(NOT_QUICK) else ["quick"])


def pytest_collection_modifyitems(config, items):
    """Each test's tier (tier_markers). The directories above come first (a stable sort), so that workers start on
    them."""
    for item in items:
        marked = {m.name for m in item.iter_markers()}
        for name in tier_markers(marked, set(getattr(item, "fixturenames", ()))):
            item.add_marker(name)
    order = {unit: i for i, unit in enumerate(SHARED_UNITS)}
    items.sort(key=lambda item: order.get(work_unit(item.nodeid), len(order)))


# What starts a process, whichever library asks: Popen (subprocess.run, check_output, os.popen), fork (os.spawn*,
# multiprocessing's fork), fork_exec (multiprocessing's spawn), posix_spawn, system
PROCESS_STARTERS = (("subprocess", "Popen._execute_child"), ("os", "fork"), ("os", "forkpty"), ("os", "posix_spawn"),
                    ("os", "posix_spawnp"), ("os", "system"), ("_posixsubprocess", "fork_exec"))


class EmbeddedModelGuard:
    """A finder first on sys.meta_path that fails the test when an embedded model's package is looked up: gac finds
    the model's GGUF through importlib.util.find_spec (gac.checkpoint.loading.embedded_gguf)."""

    def __init__(self):
        from gac.checkpoint.loading import EMBEDDED

        self.packages = frozenset(EMBEDDED.values())

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.packages:
            pytest.fail(f"a quick test may not read the embedded model ({fullname}): mark it `integration`")
        return None


def _refuse_process(*args, **kwargs):
    pytest.fail("a quick test may not start a process: mark it `subprocess`, or run gac in this process with "
                "tests.helpers.gac_cli")


@contextlib.contextmanager
def quick_guard():
    """While a quick test runs (its fixtures' set-up and teardown too), starting a process or looking up the
    embedded model fails the test (pytest.fail: no `except Exception` swallows it), so a test that does either
    without its marker fails instead of slowing the tier."""
    guard = EmbeddedModelGuard()
    with pytest.MonkeyPatch.context() as mp:
        for module, name in PROCESS_STARTERS:
            owner, _, attr = name.rpartition(".")
            target = importlib.import_module(module)
            mp.setattr(getattr(target, owner) if owner else target, attr, _refuse_process)
        sys.meta_path.insert(0, guard)  # in place: an import hook another module adds meanwhile stays
        try:
            yield
        finally:
            sys.meta_path.remove(guard)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A quick test runs under quick_guard, in the quick tier and in the full suite alike."""
    if item.get_closest_marker("quick") is None:
        return (yield)
    with quick_guard():
        return (yield)


def pytest_configure(config):
    """Each pytest-xdist worker computes on its share of the cores: with every worker on all of them, a parallel
    region's threads wait at its barrier for a thread the other worker's work has taken off its core."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker a core, at most MAX_WORKERS (each may hold the embedded model or start vLLM)."""
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def pytest_xdist_make_scheduler(config, log):
    """Whole work units to each worker (pytest-xdist's --dist loadgroup does not group under pytest 9.2, its
    issue #1386; its scope scheduler with our units does)."""
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnits(config, log)
