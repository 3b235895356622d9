"""What a run optimises: the `Objective` interface, one weighted
cross-entropy, and the masked-LM and causal-LM objectives.

Every loss is kept in sum form: an objective returns, for one
(micro-)batch, sums that add up over micro-batches and devices (one
"<term>_loss_sum" per loss term, plus whatever its metrics need), and each
term's whole-batch denominator. The train step divides once:

  loss = Σ_term  <term>_loss_sum / denominators[term]

so gradient accumulation and data parallelism give exactly the gradient a
single large batch would. ALBERT's official loss is the MLM cross-entropy
averaged over masked positions (weights summed, + 1e-5) plus the mean
sentence-order cross-entropy; GPT-1's is the next-token cross-entropy
averaged over the predicted positions. ELECTRA's is in
`albert_jax.training.electra`, each fine-tuning task's in
`albert_jax.finetune.task.TaskObjective`; all implement `Objective`.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

import jax
import jax.numpy as jnp
import optax

from albert_jax.model import encoder as encoder_lib

Batch = Mapping[str, jax.Array]
Sums = dict[str, jax.Array]

MLM_EPS = 1e-5  # the official denominator guard


class Objective(Protocol):
  """The loss interface the train and eval steps drive."""

  def sums(self, params: Any, batch: Batch, rng: jax.Array | None,
           deterministic: bool) -> Sums:
    """One (micro-)batch's sums: a "<term>_loss_sum" per loss term and the
    sums `metrics` reads. `rng` is None in evaluation."""

  def denominators(self, batch: Batch) -> dict[str, jax.Array]:
    """Each loss term's divisor over the whole (accumulated) batch."""

  def metrics(self, sums: Sums) -> dict[str, jax.Array]:
    """Losses and accuracies from sums added over batches; "loss" is the
    objective's value."""


def loss(sums: Sums, denominators: Mapping[str, jax.Array]) -> jax.Array:
  """Σ_term sums["<term>_loss_sum"] / denominators[term]."""
  return sum(sums[f"{term}_loss_sum"] / den
             for term, den in denominators.items())


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """−log softmax(logits)[label] in float32: logits [..., K], labels [...]
  int → [...]."""
  return optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), labels.astype(jnp.int32))


def weighted_cross_entropy(logits: jax.Array, labels: jax.Array,
                           weights: jax.Array) -> dict[str, jax.Array]:
  """Weighted sums of cross-entropy and of correct argmax predictions.

  Args:
    logits: [..., K].
    labels: [...] int; where the weight is 0 any value is allowed (-1 for
      "no label"): it is clipped into range and contributes exactly 0.
    weights: [...] float, 0 for padding and unlabelled positions.

  Returns:
    {"loss_sum": Σ w·CE, "correct": Σ w·[argmax = label], "weight": Σ w},
    float32 scalars.
  """
  weights = weights.astype(jnp.float32)
  safe = jnp.clip(labels, 0, logits.shape[-1] - 1).astype(jnp.int32)
  real = weights > 0
  # where() rather than a product alone: a padding position's garbage must
  # not turn into NaN·0.
  nll = jnp.where(real, cross_entropy(logits, safe), 0.0)
  correct = jnp.where(real, jnp.argmax(logits, axis=-1) == safe, False)
  return {"loss_sum": jnp.sum(nll * weights),
          "correct": jnp.sum(correct.astype(jnp.float32) * weights),
          "weight": jnp.sum(weights)}


def _prefixed(prefix: str, sums: dict[str, jax.Array]) -> Sums:
  return {f"{prefix}_{k}": v for k, v in sums.items()}


def mlm_sums(logits: jax.Array, labels: jax.Array, weights: jax.Array
             ) -> Sums:
  """logits [B, P, V], labels [B, P], weights [B, P] → "mlm_loss_sum",
  "mlm_correct", "mlm_weight"."""
  return _prefixed("mlm", weighted_cross_entropy(logits, labels, weights))


def sentence_sums(logits: jax.Array, labels: jax.Array) -> Sums:
  """logits [B, 2] (packed: [B, K, 2]), labels [B] ([B, K]; −1 = no label)
  → "sop_loss_sum",
  "sop_correct", "sop_count"."""
  sums = weighted_cross_entropy(logits, labels,
                                (labels >= 0).astype(jnp.float32))
  return {"sop_loss_sum": sums["loss_sum"], "sop_correct": sums["correct"],
          "sop_count": sums["weight"]}


def padding_sums(attention_mask: jax.Array) -> Sums:
  """[B, T] mask (0 = padding) → "real_tokens" and "tokens" of the batch:
  sums, so micro-batches and devices add up to the whole batch's."""
  return {"real_tokens": jnp.sum((attention_mask != 0).astype(jnp.float32)),
          "tokens": jnp.asarray(attention_mask.size, jnp.float32)}


def padding_metrics(sums: Sums) -> dict[str, jax.Array]:
  """"padding_fraction": the share of the batch's positions that hold no
  token (compute spent on nothing; packing lowers it)."""
  return {"padding_fraction": 1.0 - sums["real_tokens"]
          / jnp.maximum(sums["tokens"], 1.0)}


def lm_targets(input_ids: jax.Array, attention_mask: jax.Array
               ) -> tuple[jax.Array, jax.Array]:
  """Next-token targets: position t predicts token t + 1.

  Args:
    input_ids: [B, T] int.
    attention_mask: [B, T] int; 0 = padding, equal non-zero values mark one
      packed sequence.

  Returns:
    (labels, weights), each [B, T - 1]: labels[:, t] = input_ids[:, t + 1],
    weight 1 where tokens t and t + 1 are both real and of one sequence
    (a sequence's last token predicts nothing), else 0.
  """
  mask = attention_mask.astype(jnp.int32)
  same = (mask[:, :-1] == mask[:, 1:]) & (mask[:, 1:] != 0)
  return input_ids[:, 1:], same.astype(jnp.float32)


def lm_sums(logits: jax.Array, labels: jax.Array, weights: jax.Array
            ) -> Sums:
  """Next-token sums: logits [N, T, V] (position t scoring token t + 1),
  labels and weights [N, T - 1] (`lm_targets`) → "lm_loss_sum",
  "lm_correct", "lm_count"."""
  sums = weighted_cross_entropy(logits[:, :-1], labels, weights)
  return {"lm_loss_sum": sums["loss_sum"], "lm_correct": sums["correct"],
          "lm_count": sums["weight"]}


def masked_lm_metrics(sums: Sums) -> dict[str, jax.Array]:
  """MLM (and sentence-task) losses and accuracies; "loss" the official
  objective."""
  out = {
      "mlm_loss": sums["mlm_loss_sum"] / (sums["mlm_weight"] + MLM_EPS),
      "mlm_accuracy": sums["mlm_correct"] / jnp.maximum(sums["mlm_weight"],
                                                        1.0),
  }
  out["loss"] = out["mlm_loss"]
  if "sop_loss_sum" in sums:
    count = jnp.maximum(sums["sop_count"], 1.0)
    out["sop_loss"] = sums["sop_loss_sum"] / count
    out["sop_accuracy"] = sums["sop_correct"] / count
    out["loss"] = out["loss"] + out["sop_loss"]
  if "real_tokens" in sums:
    out.update(padding_metrics(sums))
  return out


def lm_metrics(sums: Sums) -> dict[str, jax.Array]:
  """Causal-LM loss (nats per predicted token), accuracy and perplexity."""
  count = jnp.maximum(sums["lm_count"], 1.0)
  loss_ = sums["lm_loss_sum"] / count
  out = {"lm_loss": loss_, "lm_accuracy": sums["lm_correct"] / count,
         "lm_perplexity": jnp.exp(loss_), "loss": loss_}
  if "real_tokens" in sums:
    out.update(padding_metrics(sums))
  return out


class MaskedLMObjective:
  """ALBERT's, BERT's and RoBERTa's pre-training loss: MLM, plus the
  sentence-order (or next-sentence) loss when the model has the "sop" head.

  The loader always yields `sentence_labels` (−1 without a sentence
  objective); only a model with the sentence head has a term for them.
  Packed batches (several instances per row, `loader.batch_schema` with K)
  restart positions per instance and score each instance's [CLS]
  (`sentence_labels` and `cls_positions` [B, K], −1 for an unused slot).
  """

  def __init__(self, model, right_padded: bool = False, packed: bool = False):
    """`model`: an `albert.Albert` with the "mlm" head; `right_padded`: the
    batches' rows are one instance then padding (`Albert`'s promise of that
    name), as the unpacked pre-training loader writes them; `packed`: the
    batches are packed rows."""
    if packed and right_padded:
      raise ValueError("Packed rows hold several sequences; they are not "
                       "right_padded.")
    self.model = model
    self.sentence_task = "sop" in model.heads
    self.right_padded = right_padded
    self.packed = packed

  def outputs(self, params, batch: Batch, rng, deterministic: bool
              ) -> dict[str, jax.Array]:
    """The model's outputs for `batch` (`albert.Albert`'s dict; packed:
    "sop_logits" [B, K, 2], one per instance)."""
    if self.packed:
      positions = encoder_lib.segment_position_ids(self.model.config,
                                                   batch["attention_mask"])
    else:
      # Positions from the attention mask, not the ids: a masked token that
      # the masker replaced by a random <pad> must not shift the rest.
      positions = encoder_lib.position_ids(
          self.model.config, batch["input_ids"], batch["attention_mask"])
    return self.model.apply(
        {"params": params}, batch["input_ids"], batch["token_type_ids"],
        batch["attention_mask"], position_ids=positions,
        masked_positions=batch["masked_positions"],
        deterministic=deterministic, right_padded=self.right_padded,
        cls_positions=batch["cls_positions"] if self.packed else None,
        rngs=None if deterministic else {"dropout": rng})

  def sums(self, params, batch: Batch, rng, deterministic: bool) -> Sums:
    out = self.outputs(params, batch, rng, deterministic)
    sums = mlm_sums(out["mlm_logits"], batch["masked_ids"],
                    batch["masked_weights"])
    if self.sentence_task:
      sums.update(sentence_sums(out["sop_logits"], batch["sentence_labels"]))
    sums.update(padding_sums(batch["attention_mask"]))
    return sums

  def denominators(self, batch: Batch) -> dict[str, jax.Array]:
    dens = {"mlm": jnp.sum(batch["masked_weights"].astype(jnp.float32))
                   + MLM_EPS}
    if self.sentence_task:
      dens["sop"] = jnp.maximum(jnp.sum(
          (batch["sentence_labels"] >= 0).astype(jnp.float32)), 1.0)
    return dens

  def metrics(self, sums: Sums) -> dict[str, jax.Array]:
    return masked_lm_metrics(sums)


class CausalLMObjective:
  """GPT-1's next-token objective: Σ lm_loss_sum / lm_count over the whole
  batch, each token predicting the next within its own packed segment."""

  def __init__(self, model, right_padded: bool = False):
    """`model`: an `albert.Albert` with `causal` set and the "lm" head;
    `right_padded` as `MaskedLMObjective`'s."""
    self.model = model
    self.right_padded = right_padded

  def sums(self, params, batch: Batch, rng, deterministic: bool) -> Sums:
    out = self.model.apply(
        {"params": params}, batch["input_ids"], batch["token_type_ids"],
        batch["attention_mask"], deterministic=deterministic,
        right_padded=self.right_padded,
        rngs=None if deterministic else {"dropout": rng})
    labels, weights = lm_targets(batch["input_ids"], batch["attention_mask"])
    return {**lm_sums(out["lm_logits"], labels, weights),
            **padding_sums(batch["attention_mask"])}

  def denominators(self, batch: Batch) -> dict[str, jax.Array]:
    _, weights = lm_targets(batch["input_ids"], batch["attention_mask"])
    return {"lm": jnp.maximum(jnp.sum(weights), 1.0)}

  def metrics(self, sums: Sums) -> dict[str, jax.Array]:
    return lm_metrics(sums)
