"""ELECTRA's objective: generator MLM + weighted replaced-token detection.

  loss = gen_weight · MLM(generator) + disc_weight · BCE(discriminator)

with the official weights 1 and 50, each loss a mean over the whole batch
(masked positions, non-padding tokens), kept in sum form like every
objective (`albert_jax.training.objectives`). The models are in
`albert_jax.model.electra`; `config.electra` is `ElectraOptions`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import optax

from albert_jax import hints
from albert_jax.model import electra as electra_model
from albert_jax.training import objectives

# ELECTRA's guard on both loss denominators (ALBERT's MLM uses 1e-5).
EPS = 1e-6
# Eval samples come from this key folded with a checksum of the batch.
EVAL_SEED = 918_273


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class ElectraOptions:
  """`config.electra`: the generator's size, loss weights and sampling.

  Attributes:
    generator_fraction: the generator's hidden size as a fraction of the
      discriminator's, in (0, 1]; the paper uses 1/4 (1/3 for base).
    gen_weight: weight of the generator's MLM loss (official 1).
    disc_weight: weight of the discriminator's loss (official 50).
    temperature: the generator's logits are divided by it before sampling
      (official 1; towards 0 the sample becomes the argmax).
  """
  generator_fraction: float = 0.25
  gen_weight: float = 1.0
  disc_weight: float = 50.0
  temperature: float = 1.0

  def __post_init__(self):
    electra_model.check_fraction(self.generator_fraction)
    for name in ("gen_weight", "disc_weight"):
      value = getattr(self, name)
      if not _is_number(value) or not 0.0 <= value < math.inf:
        raise ValueError(f"config.electra.{name} must be a finite number "
                         f">= 0, got {value!r}.")
    if self.gen_weight == 0.0 and self.disc_weight == 0.0:
      raise ValueError("config.electra.gen_weight and disc_weight are both "
                       "0, which leaves nothing to train.")
    if not _is_number(self.temperature) or not (
        0.0 < self.temperature < math.inf):
      raise ValueError(f"config.electra.temperature must be a finite number "
                       f"> 0, got {self.temperature!r}.")

  @classmethod
  def from_config(cls, section: Any) -> "ElectraOptions":
    """From a run config's `electra` section (a ConfigDict or JSON dict;
    None where the config has none)."""
    if section is None:
      raise ValueError(
          "config.pretraining='electra' needs a config.electra section "
          f"with {[f.name for f in dataclasses.fields(cls)]}; start from "
          "configs/electra_small.py.")
    values = dict(section)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in values if k not in names]
    if unknown:
      named = [f"{k!r}{hints.did_you_mean(k, names)}" for k in unknown]
      raise ValueError(f"Unknown config.electra keys: {', '.join(named)}; "
                       f"valid: {names}.")
    return cls(**values)


def electra_sums(outputs: Mapping[str, jax.Array], batch: Mapping[str, Any],
                 options: ElectraOptions) -> dict[str, jax.Array]:
  """One (micro-)batch's sums from `Electra`'s outputs.

  "gen_loss_sum" and "disc_loss_sum" are the weighted loss terms the train
  step divides by `ElectraObjective.denominators`; the rest feed `metrics`.
  """
  sums = objectives.mlm_sums(outputs["mlm_logits"], batch["masked_ids"],
                             batch["masked_weights"])
  real = batch["attention_mask"] != 0
  replaced = outputs["fake_ids"] != outputs["original_ids"]
  logits = outputs["rtd_logits"].astype(jnp.float32)
  bce = optax.sigmoid_binary_cross_entropy(logits,
                                           replaced.astype(jnp.float32))
  predicted = logits > 0
  slots = batch["masked_weights"] > 0
  count = lambda x: jnp.sum(x.astype(jnp.float32))  # noqa: E731
  sums.update(
      rtd_loss_sum=jnp.sum(jnp.where(real, bce, 0.0)),
      rtd_correct=count(real & (predicted == replaced)),
      rtd_count=count(real),
      rtd_replaced=count(real & replaced),
      rtd_predicted=count(real & predicted),
      rtd_true_positive=count(real & predicted & replaced),
      sampled_equal=count(slots & (outputs["sampled_ids"]
                                   == batch["masked_ids"])))
  sums["gen_loss_sum"] = options.gen_weight * sums["mlm_loss_sum"]
  sums["disc_loss_sum"] = options.disc_weight * sums["rtd_loss_sum"]
  return sums


def eval_key(batch: Mapping[str, jax.Array]) -> jax.Array:
  """The sampling key of an eval batch: `EVAL_SEED` folded with a checksum
  of its input ids, so one batch always gets the same samples."""
  ids = batch["input_ids"].astype(jnp.uint32)
  # Distinct odd multipliers per position, so moved tokens change the sum.
  index = jnp.arange(ids.size, dtype=jnp.uint32).reshape(ids.shape)
  checksum = jnp.sum(ids * (index * jnp.uint32(2654435761) | 1))
  return jax.random.fold_in(jax.random.key(EVAL_SEED), checksum)


class ElectraObjective:
  """ELECTRA's loss in the train step's sum form (see
  `objectives.Objective`): two terms, "gen" and "disc", whose
  weights sit in the sums so that every sum adds up exactly over
  micro-batches and devices."""

  def __init__(self, model: electra_model.Electra, options: ElectraOptions):
    self.model = model
    self.options = options

  def sums(self, params, batch: dict, rng, deterministic: bool) -> dict:
    """Sums of one (micro-)batch.

    `rng` drives the generator's samples and dropout. The eval step passes
    None: its samples are still random, but from `eval_key(batch)`, a fixed
    key folded with a checksum of the batch, so evaluating the same batch
    again (another checkpoint, a rerun) draws the same noise.
    """
    key = eval_key(batch) if rng is None else rng
    sample_key, dropout_key = jax.random.split(key)
    # right_padded: the loader's rows are one instance, then padding.
    out = self.model.apply(
        {"params": params}, batch["input_ids"], batch["masked_positions"],
        batch["masked_ids"], batch["masked_weights"], batch["token_type_ids"],
        batch["attention_mask"], temperature=self.options.temperature,
        deterministic=deterministic, right_padded=True,
        rngs={"sample": sample_key, "dropout": dropout_key})
    return electra_sums(out, batch, self.options)

  def denominators(self, batch: dict) -> dict[str, jax.Array]:
    """Whole-batch counts: masked slots (generator), real tokens
    (discriminator)."""
    weights = jnp.sum(batch["masked_weights"].astype(jnp.float32))
    real = jnp.sum((batch["attention_mask"] != 0).astype(jnp.float32))
    return {"gen": weights + EPS, "disc": real + EPS}

  def metrics(self, sums: dict) -> dict[str, jax.Array]:
    """Losses, accuracies and the discriminator's task from summed sums."""
    o = self.options
    mlm_loss = sums["mlm_loss_sum"] / (sums["mlm_weight"] + EPS)
    rtd_loss = sums["rtd_loss_sum"] / (sums["rtd_count"] + EPS)
    at_least_1 = lambda x: jnp.maximum(x, 1.0)  # noqa: E731
    return {
        "loss": o.gen_weight * mlm_loss + o.disc_weight * rtd_loss,
        "mlm_loss": mlm_loss,
        "mlm_accuracy": sums["mlm_correct"] / at_least_1(sums["mlm_weight"]),
        "rtd_loss": rtd_loss,
        "rtd_accuracy": sums["rtd_correct"] / at_least_1(sums["rtd_count"]),
        "rtd_precision": sums["rtd_true_positive"] / at_least_1(
            sums["rtd_predicted"]),
        "rtd_recall": sums["rtd_true_positive"] / at_least_1(
            sums["rtd_replaced"]),
        "replaced_fraction": sums["rtd_replaced"] / at_least_1(
            sums["rtd_count"]),
        "sampled_equals_original": sums["sampled_equal"] / at_least_1(
            sums["mlm_weight"]),
    }
