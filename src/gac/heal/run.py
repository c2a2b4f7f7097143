"""`gac heal`: distill a compressed gac output from its original and save it through the same save path, so the
healed model has the same dims and parameter count and loads wherever the unhealed one does."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gac.calibration.texts import TextConfig
from gac.checkpoint.gac_dir import MODELING_HASH, check_out_dir, is_gac_dir, load, plan_record, read_plan, save
from gac.checkpoint.loading import EMBEDDED, load_model
from gac.distributed import barrier, broadcast_object, from_env, session
from gac.errors import ConfigError, GacError, literal
from gac.heal.distill import DistillConfig, distill
from gac.heal.parallel import check_ranks
from gac.heal.plot import PLOT_FILE, heal_png
from gac.heal.samples import sample_windows
from gac.heal.texts import VAL_WINDOWS, HealTexts, heal_windows
from gac.io import validate
from gac.io.validate import field_integer
from gac.models.groups import compressed_dims_of
from gac.models.structure import structure_of

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from gac.distributed import World

log = logging.getLogger(__name__)

HEAL_FILE = "heal.json"  # the healing report beside the healed model


@dataclass(frozen=True)
class HealConfig:
    """Every default of `gac heal` (and of `gac compress --heal`) lives here."""

    original: str | None = None  # the teacher (--original); None: the original recorded in gac_plan.json
    heal_file: str | None = None  # training text; None: the calibration docs and the standard library's sources
    unlike_file: str | None = None  # the text unlike the calibration text; None: gac.calibration.texts.unlike_texts()
    samples: int = 0  # --heal-samples: windows sampled from the original beside the healing text (0: none; off by
    # default, since sampling costs minutes for no clear gain)
    text: TextConfig = TextConfig()  # seq_len, eval_file and eval_windows (the calibration fields are unused)
    distill: DistillConfig = field(default_factory=DistillConfig)
    device: str = "cpu"
    force: bool = False
    progress: bool = True
    dist_timeout_s: float | None = None  # under torchrun: how long a rank waits for the others at a collective (None:
    # GAC_DIST_TIMEOUT, else gac.distributed.DEFAULT_TIMEOUT_S)

    def __post_init__(self) -> None:
        if self.samples != 0:  # some for early stopping, at least one to train on (or 0: none)
            field_integer(self.samples, "samples", minimum=VAL_WINDOWS + 1, example=64, also="0 for none")
        if self.dist_timeout_s is not None and not self.dist_timeout_s > 0:
            raise ConfigError(f"dist_timeout_s {self.dist_timeout_s} must be positive, e.g. {{dist_timeout_s:300}}")

    def windows(self, tokenizer: PreTrainedTokenizerBase) -> HealTexts:
        """The texts' token windows (gac.heal.texts.HealTexts): read before any model, so a bad text fails first."""
        return heal_windows(
            tokenizer,
            heal_file=self.heal_file,
            eval_file=self.text.eval_file,
            unlike_file=self.unlike_file,
            seq_len=self.text.seq_len,
            eval_windows=self.text.eval_windows,
        )


@dataclass
class HealOutput:
    out: Path | None  # None on a torchrun rank other than 0, which writes nothing
    report: dict  # heal.json's content


def original_of(model_dir: Path, plan: dict) -> str:
    """The uncompressed model an output was made from, as its plan records it (through a repair's source plan)."""
    while isinstance(plan.get("source_plan"), dict):
        plan = plan["source_plan"]
    original = plan.get("source_model")
    if not isinstance(original, str) or not original:
        raise ConfigError(
            f"{literal(model_dir)}/gac_plan.json records no original model: pass the model it was compressed from "
            "as {original}"
        )
    return original


def _check_original(original: str, model_dir: Path, given: bool) -> None:
    path = Path(original).expanduser()
    looks_local = original.startswith((".", "/", "~")) or original.count("/") != 1 or path.exists()
    if original not in EMBEDDED and looks_local and not path.exists():
        where = "{original}" if given else f"{literal(model_dir)}/gac_plan.json"
        raise ConfigError(
            f"the original model {literal(original)} named by {where} is not found: pass the uncompressed model "
            "it was made from as {original}"
        )


def _check_teacher(teacher: PreTrainedModel, student: PreTrainedModel, original: str) -> None:
    if compressed_dims_of(teacher):
        raise ConfigError(
            f"the original model {literal(original)} is itself compressed: pass the uncompressed model the output "
            "was made from as {original}"
        )
    keys = ("vocab_size", "hidden_size", "num_hidden_layers")
    if any(getattr(teacher.config, k, None) != getattr(student.config, k, None) for k in keys):
        raise ConfigError(
            f"the original model {literal(original)} does not match the compressed one ({', '.join(keys)} differ): "
            "pass the model it was made from as {original}"
        )


def _tokenizer(path: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        raise GacError(
            f"{path} has no readable tokenizer: re-run `gac compress`, which saves one beside the model"
        ) from None


def _shape(model: nn.Module) -> tuple[dict[str, Any], int]:
    """(structure, parameter count): what healing must leave as it found it."""
    return structure_of(model), sum(p.numel() for p in model.parameters())


def heal_model(student: PreTrainedModel, teacher: PreTrainedModel, texts: HealTexts, cfg: HealConfig) -> dict[str, Any]:
    """Distill `student` (a compressed model, trained in place) from `teacher` (its original) on `texts`
    (cfg.windows(tokenizer)) and return the report: perplexity before and after on the held-out docs and on the
    unlike texts, the original's beside, and the run."""
    if texts.dropped:
        log.info("healing: %d windows sharing text with the evaluation windows left out", texts.dropped)
    shape = _shape(student)
    evaluated = texts.evaluated()
    original = texts.cached_perplexities(teacher, "original", cfg.progress)
    before = texts.perplexities(student, "before", cfg.progress)
    start = time.perf_counter()
    if cfg.samples:
        sampled = sample_windows(
            teacher,
            cfg.samples,
            cfg.text.seq_len,
            seed=cfg.distill.seed,
            dtype=cfg.distill.compute_dtype(cfg.device),
            progress=cfg.progress,
        )
        # every rank samples alike, with the same seed; rank 0's for all, as ranks on other devices may draw others
        texts = texts.with_samples(broadcast_object(sampled, what="sharing the sampled windows"))
    sampling_seconds = time.perf_counter() - start
    run = distill(student, teacher, texts.train, texts.val, cfg.distill, progress=cfg.progress)
    after = texts.perplexities(student, "after", cfg.progress)  # sampled windows join training only
    if _shape(student) != shape:
        raise RuntimeError("healing changed the model's structure or parameter count")
    return {
        "texts": {
            **texts.names,
            "train_windows": texts.train.shape[0],
            "val_windows": texts.val.shape[0],
            "sampled_windows": texts.sampled,
            "sampling_seconds": round(sampling_seconds, 1),
            "dropped_windows": texts.dropped,
            "seq_len": cfg.text.seq_len,
            "eval_tokens": {k: w.numel() for k, w in evaluated.items()},
        },
        "config": dict(vars(cfg.distill)),
        "run": run.to_json(),
        "params": shape[1],
        "ppl": {"original": original, "before": before, "after": after},
        "ratio_to_original": {
            when: {k: v[k] / original[k] for k in v} for when, v in (("before", before), ("after", after))
        },
    }


def healed_summary(original: str, report: dict) -> dict:
    """gac_plan.json's `healed`: from which original, on how many tokens, and the perplexities before and after."""
    return {"original": original, "tokens": report["run"]["tokens"], "ppl": report["ppl"]}


def heal_dir(model: str, out: str, cfg: HealConfig) -> HealOutput:
    """Load the gac output `model`, heal it from its original and save it to `out` (atomically) with heal.json and
    heal.png. Under torchrun every rank loads both models and trains its share of each step (gac.heal.parallel);
    rank 0 alone writes, with heal.json's `distributed` recording what each rank computed, and the others write
    nothing (out None)."""
    validate.not_quantized(model, "heal")  # healing trains float weights: heal first, then quantize
    rank, size, _ = from_env()
    if rank == 0:
        check_out_dir(out, cfg.force)
    path = Path(model).expanduser()
    if not path.is_dir() or not is_gac_dir(path):
        raise GacError(f"{model} is not a gac output (no gac_plan.json): pass a directory `gac compress` wrote")
    plan = read_plan(path)
    original = cfg.original or original_of(path, plan)
    _check_original(original, path, given=cfg.original is not None)
    check_ranks(cfg.distill.batch, size)
    texts = cfg.windows(_tokenizer(path))
    with session(cfg.device, cfg.dist_timeout_s) as world:
        if world.active:
            cfg = dataclasses.replace(cfg, device=world.device, progress=cfg.progress and world.is_main)
        return _heal_and_save(model, out, (plan, original), texts, cfg, world)


def _heal_and_save(
    model: str, out: str, source: tuple[dict, str], texts: HealTexts, cfg: HealConfig, world: World
) -> HealOutput:
    """heal_dir's work once its input is checked: `source` is the model's plan and its original."""
    plan, original = source
    loaded = load(Path(model).expanduser(), device=cfg.device)
    teacher = load_model(original, device=cfg.device).model
    _check_teacher(teacher, loaded.model, original)
    report = {"model": str(model), "original": original, **heal_model(loaded.model, teacher, texts, cfg)}
    del teacher
    if not world.is_main:  # rank 0 writes; the others wait for it
        barrier("waiting for rank 0 to write")
        return HealOutput(None, report)
    if world.active:
        report["distributed"] = world.summary()
    kept = {
        k: v
        for k, v in plan.items()
        if k not in ("gac_plan", "variant", "source_model", "alignment", "dims", "versions", "healed", MODELING_HASH)
    }
    summary = healed_summary(original, report)
    new_plan = plan_record(
        variant=plan.get("variant"),
        source_model=plan.get("source_model"),
        alignment=plan.get("alignment"),
        dims=plan.get("dims"),
        **kept,
        healed=summary,
    )
    saved = save(
        loaded.model,
        loaded.tokenizer,
        out,
        plan=new_plan,
        extra_files={HEAL_FILE: json.dumps(report, indent=2), PLOT_FILE: heal_png(report)},
        force=cfg.force,
    )
    barrier("the final barrier")
    return HealOutput(saved, report)
