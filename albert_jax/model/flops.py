r"""Analytic training FLOPs of ALBERT / BERT, for MFU and model comparisons.

Model FLOPs utilisation needs the FLOPs the model *must* do, independent of
how XLA happens to compile it (rematerialisation, padding, fused kernels), so
they are counted here from the configuration alone, following MaxText's
convention: only matrix multiplies count, a multiply-add is 2 FLOPs, and the
backward pass costs twice the forward (one matmul for the activations'
gradient, one for the weights'), so training = 3 × forward.

Per sequence of T tokens, with N = num_hidden_layers × inner_group_num
applied blocks (a shared layer costs FLOPs every time it runs, so sharing
saves parameters, never compute), E embedding width, H hidden, F FFN width,
V vocab, C sentence labels and P positions decoded by the MLM head:

  embedding lookups                 0 (gathers, not matmuls)
  E→H projection (ALBERT only)      2·T·E·H
  attention Q, K, V, output         N · T · 4 · 2·H·H
  attention QKᵀ and PV              N · T · 4·T·H  (bidirectional: every
                                      query sees all T keys), halved for a
                                      causal model
  FFN in and out                    N · T · 2 · 2·H·F
  pooler (one token per sequence)   2·H·H
  SOP / NSP classifier              2·H·C
  RTD head H→H, H→1 (ELECTRA)       T · (2·H·H + 2·H)
  MLM transform H→E                 P · 2·H·E
  MLM decoder E→V (tied table)      P · 2·E·V
  LM map H→E (with a projection)    T · 2·H·E
  LM decoder E→V (tied table)       T · 2·E·V

P is the number of masked positions when the MLM head decodes only those
(`masked_positions` given, as in pre-training) and T otherwise; the causal
"lm" head decodes every one of the T positions. Biases, LayerNorm, softmax,
activations and dropout are elementwise and left out; attention to padding
is counted, since the hardware does it. A causal model's attention counts
half of the T² score and value products, MaxText's convention: the masked
half is work the model does not need, and the causal flash kernel skips it,
so its MFU is not inflated by work that is thrown away.

The count is checked against the program itself: `--compile_only` counts
the matmuls in the train step's lowered HLO, every loop iteration
(`tools.hlo_stats.matmul_flops`), and for ALBERT they equal this module's
count to the FLOP, attention aside (tests/tools/test_tpu_compile.py). What
the HLO adds is recomputation, which MFU leaves out: remat's forward
matmuls, and with the Pallas TPU kernels the flash backward's second pass
over the attention scores (its kernels declare 1.5x the attention FLOPs).

The module is pure Python over `ModelConfig`'s fields, so the trainer can
call it anywhere without tracing anything.
"""

from __future__ import annotations

from typing import Sequence, TYPE_CHECKING

if TYPE_CHECKING:
  from albert_jax.model.config import ModelConfig

# Mirrors albert.HEADS; not imported so that this module needs no Flax.
PRETRAINING_HEADS = ("mlm", "sop")
# Every head counted here: the defaults, ELECTRA's replaced-token head and
# the causal next-token head.
COUNTED_HEADS = ("mlm", "sop", "rtd", "lm")
# Backward costs two forward passes: d(activations) and d(weights).
TRAINING_MULTIPLIER = 3


def forward_flops_breakdown(
    cfg: ModelConfig, seq_len: int, num_predictions: int | None = None,
    pooler: bool = True, heads: Sequence[str] = PRETRAINING_HEADS,
) -> dict[str, int]:
  """Forward FLOPs of one sequence, per component (see module docstring).

  Args:
    cfg: the model's hyperparameters.
    seq_len: T, tokens per sequence (padding included).
    num_predictions: P, masked positions the MLM head decodes per sequence;
      None decodes every one of the T positions.
    pooler: whether the [CLS] pooler runs.
    heads: which of "mlm", "sop", "rtd" and "lm" run, as in
      `Albert(heads=...)`.

  Returns:
    An ordered dict of component name → FLOPs per sequence (ints, exact);
    components that do not run are 0 (the "rtd" and "lm_*" ones are present
    only with their heads).
  """
  if seq_len < 1:
    raise ValueError(f"seq_len must be positive, got {seq_len}.")
  if num_predictions is not None and not 0 <= num_predictions <= seq_len:
    raise ValueError(f"num_predictions must be in [0, seq_len={seq_len}], "
                     f"got {num_predictions}.")
  unknown = set(heads) - set(COUNTED_HEADS)
  if unknown:
    raise ValueError(f"Unknown heads {sorted(unknown)}; choose from "
                     f"{COUNTED_HEADS}.")
  t, e, h = seq_len, cfg.embedding_size, cfg.hidden_size
  f, v, c = cfg.intermediate_size, cfg.vocab_size, cfg.num_sentence_labels
  n = cfg.num_hidden_layers * cfg.inner_group_num
  p = t if num_predictions is None else num_predictions
  mlm = "mlm" in heads
  lm = "lm" in heads
  scores = n * t * 4 * t * h
  if cfg.causal:
    scores //= 2  # exact: 4·T·H is even
  parts = {
      "embedding_projection": 2 * t * e * h if cfg.embedding_projection else 0,
      "attention_projections": n * t * 4 * 2 * h * h,
      "attention_scores": scores,
      "ffn": n * t * 2 * 2 * h * f,
      "pooler": 2 * h * h if pooler else 0,
      "sop": 2 * h * c if "sop" in heads else 0,
      "mlm_transform": p * 2 * h * e if mlm else 0,
      "mlm_decoder": p * 2 * e * v if mlm else 0,
  }
  if "rtd" in heads:  # listed only where built, as the "lm" ones
    parts["rtd"] = t * (2 * h * h + 2 * h)
  if lm:  # listed only where built, so encoder-only tables stay as they were
    parts["lm_transform"] = t * 2 * h * e if cfg.embedding_projection else 0
    parts["lm_decoder"] = t * 2 * e * v
  return parts


def forward_flops_per_sequence(
    cfg: ModelConfig, seq_len: int, num_predictions: int | None = None,
    pooler: bool = True, heads: Sequence[str] = PRETRAINING_HEADS) -> int:
  """Forward FLOPs of one sequence of `seq_len` tokens (an exact int)."""
  return sum(forward_flops_breakdown(
      cfg, seq_len, num_predictions, pooler, heads).values())


def forward_flops_per_token(
    cfg: ModelConfig, seq_len: int, num_predictions: int | None = None,
    pooler: bool = True, heads: Sequence[str] = PRETRAINING_HEADS) -> float:
  """Forward FLOPs per token: the per-sequence count spread over T tokens.

  Attention's share grows with T, and the per-sequence pooler and heads
  are amortised over T, so the answer depends on `seq_len`.
  """
  return forward_flops_per_sequence(
      cfg, seq_len, num_predictions, pooler, heads) / seq_len


def training_flops_per_step(
    cfg: ModelConfig, batch: int, seq_len: int,
    num_predictions: int | None = None, pooler: bool = True,
    heads: Sequence[str] = PRETRAINING_HEADS) -> int:
  """Forward + backward FLOPs of one step on a [batch, seq_len] batch.

  `batch` is the global batch (all devices); divide by the device count for
  per-device FLOPs. Returns 3 × batch × forward FLOPs per sequence.
  """
  return TRAINING_MULTIPLIER * batch * forward_flops_per_sequence(
      cfg, seq_len, num_predictions, pooler, heads)


def training_flops_per_token(
    cfg: ModelConfig, seq_len: int, num_predictions: int | None = None,
    pooler: bool = True, heads: Sequence[str] = PRETRAINING_HEADS) -> float:
  """Forward + backward FLOPs per token (3 × `forward_flops_per_token`)."""
  return TRAINING_MULTIPLIER * forward_flops_per_token(
      cfg, seq_len, num_predictions, pooler, heads)


def mfu(flops_per_step: float, step_seconds: float,
        peak_flops_per_second: float) -> float:
  """Model FLOPs utilisation: achieved / peak, both over the same devices.

  Args:
    flops_per_step: e.g. `training_flops_per_step(...)` for the global batch.
    step_seconds: wall time of one step.
    peak_flops_per_second: the hardware peak summed over every device that
      ran the step, at the compute dtype (bf16 peak for bf16 matmuls).
  """
  if step_seconds <= 0 or peak_flops_per_second <= 0:
    raise ValueError("step_seconds and peak_flops_per_second must be > 0.")
  return flops_per_step / step_seconds / peak_flops_per_second
