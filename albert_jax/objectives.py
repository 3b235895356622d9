"""Pre-training losses and metrics, in sum form.

The official loss is the MLM cross-entropy averaged over masked positions
(weights summed, + 1e-5) plus the mean sentence-order cross-entropy. Both are
kept here as (sum, count) pairs so that gradient accumulation over
micro-batches and data parallelism over devices reduce to the same numbers a
single large batch would give: the sums add up, and the division happens once.
The causal LM (GPT-1) is kept the same way: the next-token cross-entropy
summed over the predicted positions, divided once by their count.
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


def lm_sums(logits: jax.Array, input_ids: jax.Array,
            attention_mask: jax.Array) -> dict[str, jax.Array]:
  """logits [B, T, V] (position t scoring token t + 1), input_ids and
  attention_mask [B, T] → next-token loss, correct and count sums."""
  labels, weights = lm_targets(input_ids, attention_mask)
  logits = logits[:, :-1]
  loss = cross_entropy(logits, labels)
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return {"lm_loss_sum": jnp.sum(loss * weights),
          "lm_correct": jnp.sum(correct * weights),
          "lm_count": jnp.sum(weights)}


def lm_metrics_from_sums(sums: dict[str, jax.Array]
                         ) -> dict[str, jax.Array]:
  """Causal-LM loss (nats per predicted token), accuracy and perplexity."""
  count = jnp.maximum(sums["lm_count"], 1.0)
  loss = sums["lm_loss_sum"] / count
  return {"lm_loss": loss, "lm_accuracy": sums["lm_correct"] / count,
          "lm_perplexity": jnp.exp(loss), "loss": loss}


class CausalLMObjective:
  """GPT-1's next-token objective for `train_step.make_train_step`.

  Same interface as `train_step.PretrainingObjective`: the sums of one
  (micro-)batch, the whole batch's denominator per loss term, and the
  metrics from accumulated sums. The loss is Σ lm_loss_sum / lm_count over
  the whole batch, so accumulation and data parallelism are exact.
  """

  def __init__(self, model):
    """`model`: a `models.Albert` with `causal` set and the "lm" head."""
    self.model = model

  def sums(self, params, batch: dict, rng, deterministic: bool) -> dict:
    out = self.model.apply(
        {"params": params}, batch["input_ids"], batch["token_type_ids"],
        batch["attention_mask"], deterministic=deterministic,
        rngs=None if deterministic else {"dropout": rng})
    return lm_sums(out["lm_logits"], batch["input_ids"],
                   batch["attention_mask"])

  def denominators(self, batch: dict) -> dict[str, jax.Array]:
    _, weights = lm_targets(batch["input_ids"], batch["attention_mask"])
    return {"lm": jnp.maximum(jnp.sum(weights), 1.0)}

  def metrics(self, sums: dict) -> dict[str, jax.Array]:
    return lm_metrics_from_sums(sums)
