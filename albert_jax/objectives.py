"""Pre-training losses and metrics, in sum form.

The official loss is the MLM cross-entropy averaged over masked positions
(weights summed, + 1e-5) plus the mean sentence-order cross-entropy. Both are
kept here as (sum, count) pairs so that gradient accumulation over
micro-batches and data parallelism over devices reduce to the same numbers a
single large batch would give: the sums add up, and the division happens once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

MLM_EPS = 1e-5  # the official denominator guard


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-position −log softmax(logits)[label]; logits [..., V], labels [...]."""
  logits = logits.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  picked = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32),
                               axis=-1)[..., 0]
  return log_z - picked


def mlm_sums(logits: jax.Array, labels: jax.Array, weights: jax.Array
             ) -> dict[str, jax.Array]:
  """logits [B, P, V], labels [B, P], weights [B, P] → loss, correct and
  weight sums."""
  weights = weights.astype(jnp.float32)
  loss = cross_entropy(logits, labels)
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return {"mlm_loss_sum": jnp.sum(loss * weights),
          "mlm_correct": jnp.sum(correct * weights),
          "mlm_weight": jnp.sum(weights)}


def sentence_sums(logits: jax.Array, labels: jax.Array
                  ) -> dict[str, jax.Array]:
  """logits [B, 2], labels [B] (−1 = no label) → loss/correct/count sums."""
  valid = (labels >= 0).astype(jnp.float32)
  safe = jnp.maximum(labels, 0)
  loss = cross_entropy(logits, safe)
  correct = (jnp.argmax(logits, axis=-1) == safe).astype(jnp.float32)
  return {"sop_loss_sum": jnp.sum(loss * valid),
          "sop_correct": jnp.sum(correct * valid),
          "sop_count": jnp.sum(valid)}


def pretraining_sums(outputs: dict, batch: dict) -> dict[str, jax.Array]:
  """Sums for one (micro-)batch from the model's outputs."""
  sums = mlm_sums(outputs["mlm_logits"], batch["masked_ids"],
                  batch["masked_weights"])
  if "sop_logits" in outputs:
    sums.update(sentence_sums(outputs["sop_logits"],
                              batch["sentence_labels"]))
  return sums


def loss_from_sums(sums: dict[str, jax.Array]) -> jax.Array:
  """The official objective from accumulated sums."""
  loss = sums["mlm_loss_sum"] / (sums["mlm_weight"] + MLM_EPS)
  if "sop_loss_sum" in sums:
    loss = loss + sums["sop_loss_sum"] / jnp.maximum(sums["sop_count"], 1.0)
  return loss


def metrics_from_sums(sums: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Losses and accuracies for logging."""
  out = {
      "mlm_loss": sums["mlm_loss_sum"] / (sums["mlm_weight"] + MLM_EPS),
      "mlm_accuracy": sums["mlm_correct"] / jnp.maximum(sums["mlm_weight"],
                                                        1.0),
  }
  if "sop_loss_sum" in sums:
    count = jnp.maximum(sums["sop_count"], 1.0)
    out["sop_loss"] = sums["sop_loss_sum"] / count
    out["sop_accuracy"] = sums["sop_correct"] / count
  out["loss"] = loss_from_sums(sums)
  return out
