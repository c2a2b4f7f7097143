"""Distillation of a compressed model from its original: KL divergence of the logits plus (by default half) the
cross-entropy on the healing text, optionally matching each layer's hidden states, training the student's own tensors
in place; its modules and dims never change."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from gac.distributed import collective, sum_numbers, windows_share, world
from gac.errors import ConfigError, literal
from gac.heal.parallel import check_ranks, data_parallel, step_losses, step_share, taken_by_rank
from gac.io.validate import field_integer, field_real

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers.modeling_outputs import CausalLMOutputWithPast

log = logging.getLogger(__name__)
# the --heal-tokens budget: 96 steps of 2 x 512 tokens, sized to a quarter of an hour on a small CPU with native bf16
# (longer where it runs fp32)
DEFAULT_TOKENS = 98304
PRECISIONS = ("auto", "bf16", "fp32")
TRAINED = ("all", "changed")  # --heal-train: which of the decoder's tensors healing trains
IGNORED = -100  # the label of a position with no next token in its window
MIN_IMPROVEMENT = 1e-3  # a held-out loss this share lower counts as better for early stopping


@dataclass(frozen=True)
class DistillConfig:
    """How the student is trained: a token budget, AdamW with warm-up and cosine decay, early stop on held-out loss."""

    tokens: int = DEFAULT_TOKENS  # training tokens (--heal-tokens): steps = tokens // (batch * seq_len)
    lr: float = 3e-4  # peak learning rate (--heal-lr)
    batch: int = 2  # windows per step
    hidden_weight: float = 0.0  # weight of the hidden-state matching term (--hidden-weight); 0: logits only
    ce_weight: float = 0.5  # --ce-weight: weight of the cross-entropy on the healing text's own next tokens beside
    # the KL (the student's target: the original's distribution and the text's token, 1 : ce_weight): it heals
    # further on every text than the KL alone at a larger budget; 0: the KL alone
    eval_every: int = 16  # steps between held-out evaluations
    patience: int = 2  # evaluations without improvement before stopping early
    backoff: float = 0.25  # at an evaluation without improvement: the best tensors back, the lr times this
    warmup: float = 0.1  # share of the steps the learning rate warms up over
    seed: int = 0
    train: str = "all"  # --heal-train: "all" (every decoder tensor) or "changed" (trainable_parameters); "all" heals
    # further on the docs, "changed" takes faster steps
    precision: str = "auto"  # --heal-precision: matmuls in bf16 (weights, optimizer and loss in fp32) or fp32;
    # auto: bf16 where the device computes it natively (CUDA with bf16, a CPU with AVX512-BF16 or AMX), else fp32

    def __post_init__(self) -> None:
        # fields named as HealConfig holds them (distill.tokens): the CLI words them as its --heal-* flags
        field_integer(self.tokens, "distill.tokens", example=DEFAULT_TOKENS)
        field_integer(self.batch, "distill.batch", example=2)
        field_integer(self.eval_every, "distill.eval_every", example=16)
        field_integer(self.patience, "distill.patience", example=2)
        field_real(self.backoff, "distill.backoff", low=0.0, high=1.0, example=0.25)
        field_real(self.lr, "distill.lr", low=0.0, high=1.0, example=3e-4)
        if self.train not in TRAINED:
            raise ConfigError(f"unknown {{distill.train}} {literal(repr(self.train))}: choose {', '.join(TRAINED)}")
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"unknown {{distill.precision}} {literal(repr(self.precision))}: choose {', '.join(PRECISIONS)}"
            )
        for name, value in (("distill.hidden_weight", self.hidden_weight), ("distill.ce_weight", self.ce_weight)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"bad {{{name}}} {literal(repr(value))}: give a number >= 0, e.g. {{{name}:1}}")

    def steps(self, seq_len: int) -> int:
        return max(1, self.tokens // (self.batch * seq_len))

    def compute_dtype(self, device: str | torch.device) -> torch.dtype:
        """The dtype the forward and backward matmuls run in on `device` (autocast): what `precision` resolves to."""
        if self.precision != "auto":
            return torch.bfloat16 if self.precision == "bf16" else torch.float32
        device = torch.device(device)
        if device.type == "cuda":
            native = torch.cuda.is_bf16_supported()
        else:
            native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
        return torch.bfloat16 if native else torch.float32


def autocast(device: str | torch.device, dtype: torch.dtype) -> torch.autocast:
    """Mixed precision for the distillation's forwards and backward (a no-op for fp32)."""
    device = torch.device(device)
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)


@dataclass
class DistillResult:
    steps: int  # optimizer steps taken
    tokens: int  # tokens trained on
    stopped: str  # "budget" (every step taken) or "early stop" (held-out loss stopped improving)
    best_step: int  # the step whose tensors were kept (0: the student as it came)
    held_out_loss: list = field(default_factory=list)  # [(step, held_out_loss on the validation windows)]
    backoffs: list = field(default_factory=list)  # steps after which the best tensors came back at a lower lr
    train_loss: list = field(default_factory=list)  # [(step, distillation loss)]
    seconds: float = 0.0  # wall-clock
    cpu_seconds: float = 0.0  # this process's CPU time (user + system, all threads): comparable on a shared machine
    trainable_params: int = 0
    precision: str = "fp32"  # what the matmuls ran in
    lr: float = 0.0  # the peak learning rate it started with

    def to_json(self) -> dict:
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "stopped": self.stopped,
            "best_step": self.best_step,
            "backoffs": self.backoffs,
            "held_out_loss": [[s, round(v, 5)] for s, v in self.held_out_loss],
            "train_loss": [[s, round(v, 5)] for s, v in self.train_loss],
            "seconds": round(self.seconds, 1),
            "cpu_seconds": round(self.cpu_seconds, 1),
            "trainable_params": self.trainable_params,
            "precision": self.precision,
            "lr": self.lr,
        }


def trainable_parameters(
    model: PreTrainedModel, original: PreTrainedModel | None = None, which: str = "all"
) -> list[torch.nn.Parameter]:
    """The tensors healing trains, never the token embeddings or the output head (tied on small models: a third of
    SmolLM2's parameters, trained on few tokens they overfit the words seen). "all": every other parameter of the
    decoder. "changed": of those, every vector (norms, biases) and every matrix the compression changed, that is one
    `original` has no tensor of the same name, shape and values for (factor pairs, pruned weights): the weights it left
    as they were keep the original's values and cost no weight gradients or optimizer state."""
    frozen = {
        id(p)
        for m in (model.get_input_embeddings(), model.get_output_embeddings())
        if m is not None
        for p in m.parameters()
    }
    params = [(n, p) for n, p in model.named_parameters() if id(p) not in frozen]
    if which == "all":
        return [p for _, p in params]
    if original is None:
        raise ValueError('which="changed" compares with the original: pass it')
    kept = dict(original.named_parameters())

    def unchanged(name: str, p: torch.nn.Parameter) -> bool:
        o = kept.get(name)
        return o is not None and o.shape == p.shape and torch.equal(o.detach().to(p.device), p.detach())

    return [p for n, p in params if p.dim() < 2 or not unchanged(n, p)]


def loss_name(config: dict) -> str:
    """The loss a run trained on, in words, from its config (DistillConfig's fields, as heal.json records them)."""
    hidden = config.get("hidden_weight", 0)
    return f"KL + {config.get('ce_weight', 0):g} x cross-entropy" + (
        f" + {hidden:g} x hidden-state error" if hidden else ""
    )


def distillation_loss(
    student_out: CausalLMOutputWithPast,
    teacher_out: CausalLMOutputWithPast,
    hidden_weight: float,
    tokens: torch.Tensor | None = None,
    ce_weight: float = 0.0,
) -> torch.Tensor:
    """KL(teacher || student) of the next-token distributions, mean per token; plus hidden_weight x the mean over
    layers of each layer output's squared error relative to the teacher's mean square; plus ce_weight x the
    student's cross-entropy on the next tokens of `tokens` [B, S] (the windows both models read)."""
    if student_out.logits is None or teacher_out.logits is None:
        raise ValueError("distillation compares both models' logits: run them with their heads")
    s = F.log_softmax(student_out.logits.float().flatten(0, -2), dim=-1)  # [B*S, V]
    t = F.log_softmax(teacher_out.logits.float().flatten(0, -2), dim=-1)
    loss = F.kl_div(s, t, log_target=True, reduction="batchmean")
    if hidden_weight:
        if student_out.hidden_states is None or teacher_out.hidden_states is None:
            raise ValueError("a hidden-state term needs both models' hidden states (output_hidden_states=True)")
        pairs = list(zip(student_out.hidden_states[1:], teacher_out.hidden_states[1:]))  # [B, S, D] per layer
        hidden = sum(F.mse_loss(sh, th) / th.pow(2).mean().clamp_min(1e-12) for sh, th in pairs) / len(pairs)
        loss = loss + hidden_weight * hidden
    if ce_weight:  # each position's next token; a window's last position has none (ignored: s is not copied)
        if tokens is None:
            raise ValueError("a cross-entropy term needs the windows' tokens")
        following = F.pad(tokens[:, 1:], (0, 1), value=IGNORED).flatten()  # [B*S]
        loss = loss + ce_weight * F.nll_loss(s, following, ignore_index=IGNORED)
    return loss


def _schedule(step: int, steps: int, warmup: float) -> float:
    """Learning-rate factor: linear warm-up, then cosine decay to a tenth."""
    w = max(1, round(warmup * steps))
    if step < w:
        return (step + 1) / w
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - w) / max(1, steps - w)))


def _restore(params: list[torch.nn.Parameter], best_state: list[torch.Tensor]) -> None:
    """The kept tensors back into the trained ones, in place."""
    with torch.no_grad():
        for p, kept in zip(params, best_state):
            p.copy_(kept)


def _back_off(
    params: list[torch.nn.Parameter],
    best_state: list[torch.Tensor],
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LambdaLR,
    factor: float,
) -> None:
    """After an evaluation without improvement: the best tensors back, the optimizer's moments forgotten and the
    learning rate (the schedule's peak and the current one) times `factor`, so a step size that overshoots a student
    close to its teacher costs one evaluation interval, not the run."""
    _restore(params, best_state)
    opt.state.clear()
    sched.base_lrs = [lr * factor for lr in sched.base_lrs]
    for group in opt.param_groups:
        group["lr"] *= factor


@torch.inference_mode()
def held_out_loss(
    student: PreTrainedModel,
    teacher: PreTrainedModel,
    windows: torch.Tensor,
    batch: int,
    dtype: torch.dtype = torch.float32,
    ce_weight: float = 0.0,
) -> float:
    """The distillation loss (no hidden-state term) per token on windows [n, seq] never trained on: the
    early-stopping loss. Under torchrun each rank runs its share of the windows and the sums are all-reduced: every
    rank calls it."""
    device = next(student.parameters()).device
    total = 0.0
    if world().active:
        world().record_shares("windows_val", len(windows))
    for chunk in windows_share(windows).split(batch):
        chunk = chunk.to(device)
        with autocast(device, dtype):
            loss = distillation_loss(
                student(chunk, use_cache=False), teacher(chunk, use_cache=False), 0.0, chunk, ce_weight
            )
        total += float(loss) * chunk.numel()
    if world().active:
        (total,) = sum_numbers([total], "summing the held-out loss")
    return total / windows.numel()


def distill(
    student: PreTrainedModel,
    teacher: PreTrainedModel,
    train: torch.Tensor,
    val: torch.Tensor,
    cfg: DistillConfig,
    progress: bool = True,
) -> DistillResult:
    """Train `student` in place to match `teacher` on token windows `train` [n, seq]; every cfg.eval_every steps its
    distillation loss on `val` [m, seq] (held_out_loss; never trained on) is measured and the best tensors are kept;
    an evaluation without improvement brings the best tensors back at cfg.backoff times the learning rate, and
    cfg.patience of them in a row stop the run. Returns the run's figures. Under torchrun every rank calls it with
    the same windows and trains its share of each step's (gac.heal.parallel): the same steps as one process."""
    check_ranks(cfg.batch, world().size)
    device = next(student.parameters()).device
    params = trainable_parameters(student, teacher, cfg.train)
    was_trainable = {id(p): p.requires_grad for p in student.parameters()}
    trained = {id(p) for p in params}
    for p in student.parameters():
        p.requires_grad_(id(p) in trained)
    steps = cfg.steps(train.shape[1])
    dtype = cfg.compute_dtype(device)
    if cfg.precision == "auto" and dtype == torch.float32 and device.type == "cpu":
        log.info(
            "healing in float32: this CPU has no native bf16 (AVX512-BF16 or AMX), with which a step runs 1.8x "
            "faster (docs/results/healing.md); --heal-tokens sets the budget"
        )
    best = held_out_loss(student.eval(), teacher, val, cfg.batch, dtype, cfg.ce_weight)
    # fused: one kernel for all tensors, a fraction of foreach's time a step
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _schedule(s, steps, cfg.warmup))
    gen = torch.Generator().manual_seed(cfg.seed)
    order: list[int] = []
    result = DistillResult(
        steps=0,
        tokens=0,
        stopped="budget",
        best_step=0,
        lr=cfg.lr,
        trainable_params=sum(p.numel() for p in params),
        precision=str(dtype).split(".")[-1],
    )
    result.held_out_loss.append((0, best))
    best_state = [p.detach().clone() for p in params]
    start, cpu_start, stale = time.perf_counter(), time.process_time(), 0
    hidden = cfg.hidden_weight > 0
    taken: dict[int, list[int]] = {}  # {rank: the training windows it took}, for the report's ledger
    weight = 1.0
    bar = tqdm(range(steps), desc="healing", unit="step", disable=not progress)
    try:
        with data_parallel(student) as model:
            for step in bar:
                if len(order) < cfg.batch:
                    order += torch.randperm(train.shape[0], generator=gen).tolist()
                ids = order[: cfg.batch]  # the step's windows, on every rank alike
                del order[: cfg.batch]
                mine, weight = step_share(ids)
                for r, part in taken_by_rank(ids).items():
                    taken.setdefault(r, []).extend(part)
                batch = train[mine].to(device)  # [B, S]
                with torch.no_grad(), autocast(device, dtype):
                    teacher_out = teacher(batch, use_cache=False, output_hidden_states=hidden)
                student.train()
                with autocast(device, dtype):
                    loss = distillation_loss(
                        model(batch, use_cache=False, output_hidden_states=hidden),
                        teacher_out,
                        cfg.hidden_weight,
                        batch,
                        cfg.ce_weight,
                    )
                del teacher_out
                with collective(f"averaging the gradients of step {step + 1}"):
                    (loss if weight == 1.0 else loss * weight).backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                result.steps, result.tokens = step + 1, result.tokens + len(ids) * train.shape[1]
                step_loss = float(loss.detach())
                del loss  # the step's graph goes with it
                result.train_loss.append((step + 1, step_loss))
                bar.set_postfix(loss=f"{step_loss:.4f}", held_out=f"{best:.4f}")
                if (step + 1) % cfg.eval_every and step + 1 < steps:
                    continue
                value = held_out_loss(student.eval(), teacher, val, cfg.batch, dtype, cfg.ce_weight)
                result.held_out_loss.append((step + 1, value))
                if value < best * (1 - MIN_IMPROVEMENT):
                    best, stale, result.best_step = value, 0, step + 1
                    best_state = [p.detach().clone() for p in params]
                else:
                    stale += 1
                    if stale >= cfg.patience:
                        result.stopped = "early stop"
                        break
                    _back_off(params, best_state, opt, sched, cfg.backoff)
                    result.backoffs.append(step + 1)
    finally:
        bar.close()
        _restore(params, best_state)
        for p in student.parameters():
            p.requires_grad_(was_trainable[id(p)])
        student.eval()
        del opt, best_state
    result.train_loss = step_losses(result.train_loss, weight)
    if world().active:
        world().record("windows_train", taken)
    result.seconds, result.cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    return result
