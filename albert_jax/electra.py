"""ELECTRA pre-training: a small generator, a discriminator, one embedding.

The generator is a masked LM a fraction of the discriminator's width; it
fills the masked positions with tokens sampled from its own predictions
(Gumbel-max, no gradient through the sample). The discriminator reads the
corrupted text and says, for every real token, whether it was replaced; a
sampled token equal to the original counts as not replaced. Both read one
`Embeddings` module, so the token, position and type tables are stored once
and trained by both losses. The objective is

  loss = gen_weight · MLM(generator) + disc_weight · BCE(discriminator)

with the official weights 1 and 50, each loss a mean over the whole batch
(masked positions, non-padding tokens).

The parameter tree is `Albert(config, pooler=False, heads=("rtd",))`'s
("embeddings", "encoder", "rtd": the discriminator, HF's
ElectraForPreTraining) plus "generator_encoder" and "generator_mlm", so the
discriminator loads and exports with the code every other model uses.

The run's settings (`ElectraOptions`, `generator_config`, the config
helpers and the FLOPs count) are in `albert_jax.electra_config` and
importable from here.

Shapes: B batch, T sequence, P masked slots, V vocab, H hidden.
"""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from albert_jax import models
from albert_jax import objectives
# The run settings live in electra_config; imported here so that every name
# stays importable from this module.
from albert_jax.electra_config import check_fraction  # pylint: disable=unused-import
from albert_jax.electra_config import ElectraOptions
from albert_jax.electra_config import generator_config
from albert_jax.electra_config import pretraining_config  # pylint: disable=unused-import
from albert_jax.electra_config import rtd_head_flops  # pylint: disable=unused-import
from albert_jax.electra_config import smoke_run  # pylint: disable=unused-import
from albert_jax.electra_config import training_flops_per_step  # pylint: disable=unused-import
from albert_jax.model_config import ModelConfig

# ELECTRA's guard on both loss denominators (ALBERT's MLM uses 1e-5).
EPS = 1e-6
# Eval samples come from this key folded with a checksum of the batch.
EVAL_SEED = 918_273
# The checkpoint's parts, as `load_pretrained(..., electra_part=...)` names
# them.
PARTS = ("discriminator", "generator")


def gumbel_max_sample(key: jax.Array, logits: jax.Array,
                      temperature: float = 1.0) -> jax.Array:
  """One token per row of `logits` [..., V] ~ softmax(logits / temperature).

  argmax(logits / temperature + Gumbel noise), in float32 whatever the
  compute dtype, under `stop_gradient`: nothing flows back through the
  choice. Returns [...] int32.
  """
  logits = jax.lax.stop_gradient(logits).astype(jnp.float32) / temperature
  noise = jax.random.gumbel(key, logits.shape, jnp.float32)
  return jnp.argmax(logits + noise, axis=-1).astype(jnp.int32)


def scatter_masked(ids: jax.Array, masked_positions: jax.Array,
                   masked_weights: jax.Array, values: jax.Array) -> jax.Array:
  """`ids` [B, T] with `values` [B, P] written at the real masked slots
  (weight > 0); padding slots, which point at position 0, write nothing."""
  batch, length = ids.shape
  # An out-of-range target is dropped by the scatter.
  target = jnp.where(masked_weights > 0, masked_positions, length)
  rows = jnp.arange(batch)[:, None]
  return ids.at[rows, target].set(values.astype(ids.dtype), mode="drop")


class Electra(nn.Module):
  """Generator and discriminator over one set of embeddings.

  Attributes:
    config: the discriminator's hyperparameters (the run's `config.model`).
    generator: the generator's (`generator_config(config, fraction)`).
  """
  config: ModelConfig
  generator: ModelConfig

  def setup(self):
    if getattr(self.config, "causal", False):
      raise ValueError(
          "ELECTRA's generator is a masked LM and its discriminator reads "
          "the whole corrupted text: both attend in both directions; set "
          "model.causal=False.")
    # Named as `Albert(config, pooler=False, heads=("rtd",))` names them.
    self.embeddings = models.Embeddings(self.config)
    self.encoder = models.Encoder(self.config)
    self.rtd = models.RTDHead(self.config)
    self.generator_encoder = models.Encoder(self.generator)
    # Tied to the shared word table through `self.embeddings`.
    self.generator_mlm = models.MLMHead(self.generator)

  def generate(self, input_ids, token_type_ids, position_ids, segment_ids,
               masked_positions, deterministic: bool):
    """The generator's logits [B, P, V] at `masked_positions` [B, P] of the
    masked input `input_ids` [B, T]."""
    x = self.embeddings(input_ids, token_type_ids, position_ids,
                        deterministic)
    h = self.generator_encoder(x, segment_ids, deterministic)
    return self.generator_mlm(models.gather_positions(h, masked_positions),
                              self.embeddings)

  def discriminate(self, input_ids, token_type_ids, position_ids,
                   segment_ids, deterministic: bool):
    """([B, T, H] sequence output, [B, T] replaced-token logits)."""
    x = self.embeddings(input_ids, token_type_ids, position_ids,
                        deterministic)
    h = self.encoder(x, segment_ids, deterministic)
    return h, self.rtd(h)

  def __call__(self,
               input_ids: jax.Array,
               masked_positions: jax.Array,
               masked_ids: jax.Array,
               masked_weights: jax.Array,
               token_type_ids: jax.Array | None = None,
               attention_mask: jax.Array | None = None,
               temperature: float = 1.0,
               deterministic: bool = True) -> dict[str, jax.Array]:
    """Generator, sampling, corruption and discriminator on one batch.

    Samples with the "sample" rng (and dropout with "dropout" when not
    deterministic).

    Args:
      input_ids: [B, T] the masked input (the loader's `input_ids`).
      masked_positions, masked_ids, masked_weights: [B, P] the masked slots,
        their original tokens and 1/0 for real/padding slots.
      token_type_ids: [B, T] (default zeros).
      attention_mask: [B, T], 0 = padding (default all ones).
      temperature: the generator's sampling temperature.
      deterministic: False enables dropout.

    Returns:
      dict of "mlm_logits" [B, P, V] (generator), "sampled_ids" [B, P],
      "original_ids" and "fake_ids" [B, T] (the text before masking and the
      discriminator's input), "sequence_output" [B, T, H] and "rtd_logits"
      [B, T] (discriminator).
    """
    cfg = self.config
    batch, length = input_ids.shape
    if length > cfg.max_length:
      raise ValueError(f"Sequence length {length} exceeds the model's "
                       f"{cfg.max_length} positions.")
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    segment_ids = attention_mask.astype(jnp.int32)
    original = scatter_masked(input_ids, masked_positions, masked_weights,
                              masked_ids)
    # From the original text, so a sampled pad id cannot move positions.
    if cfg.position_ids_from_padding:
      position_ids = models.padding_position_ids(original, cfg.pad_token_id)
    else:
      position_ids = jnp.broadcast_to(jnp.arange(length), (batch, length))
    mlm_logits = self.generate(input_ids, token_type_ids, position_ids,
                               segment_ids, masked_positions, deterministic)
    sampled = gumbel_max_sample(self.make_rng("sample"), mlm_logits,
                                temperature)
    fake = scatter_masked(original, masked_positions, masked_weights, sampled)
    sequence, rtd_logits = self.discriminate(
        fake, token_type_ids, position_ids, segment_ids, deterministic)
    return {"mlm_logits": mlm_logits, "sampled_ids": sampled,
            "original_ids": original, "fake_ids": fake,
            "sequence_output": sequence, "rtd_logits": rtd_logits}


def _sigmoid_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """TF's sigmoid_cross_entropy_with_logits, stable for any logit."""
  return (jnp.maximum(logits, 0.0) - logits * labels
          + jnp.log1p(jnp.exp(-jnp.abs(logits))))


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
  bce = _sigmoid_cross_entropy(logits, replaced.astype(jnp.float32))
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
  `train_step.PretrainingObjective`): two terms, "gen" and "disc", whose
  weights sit in the sums so that every sum adds up exactly over
  micro-batches and devices."""

  def __init__(self, model: Electra, options: ElectraOptions):
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
    out = self.model.apply(
        {"params": params}, batch["input_ids"], batch["masked_positions"],
        batch["masked_ids"], batch["masked_weights"], batch["token_type_ids"],
        batch["attention_mask"], temperature=self.options.temperature,
        deterministic=deterministic,
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


def init_fn(model: Electra, seq_len: int, num_predictions: int):
  """rng → boxed parameters of `model` for [*, seq_len] batches."""
  def init(rng):
    ids = jnp.zeros((1, seq_len), jnp.int32)
    slots = jnp.zeros((1, num_predictions), jnp.int32)
    return model.init({"params": rng, "sample": rng}, ids, slots, slots,
                      slots.astype(jnp.float32))["params"]
  return init


def abstract_params(disc: ModelConfig, fraction: float) -> dict[str, Any]:
  """The unboxed parameter shapes (ShapeDtypeStructs) of the `Electra` with
  discriminator `disc` and a `fraction`-wide generator."""
  model = Electra(disc, generator_config(disc, fraction))
  return nn.meta.unbox(jax.eval_shape(init_fn(model, 1, 1),
                                      jax.random.key(0)))


def part(params: Mapping[str, Any], disc: ModelConfig, fraction: float,
         name: str) -> tuple[ModelConfig, dict[str, Any], tuple[str, ...]]:
  """One half of an ELECTRA parameter tree as a stand-alone `Albert`.

  Args:
    params: `Electra`'s parameters.
    disc: the discriminator's config; `fraction` derives the generator's.
    name: "discriminator" → (config, {embeddings, encoder, rtd}, ("rtd",));
      "generator" → (generator config, {embeddings, encoder, mlm},
      ("mlm",)). Either is `Albert(config, pooler=False, heads)`'s tree.
  """
  if name == "discriminator":
    return disc, {k: params[k] for k in ("embeddings", "encoder", "rtd")}, (
        "rtd",)
  if name == "generator":
    return generator_config(disc, fraction), {
        "embeddings": params["embeddings"],
        "encoder": params["generator_encoder"],
        "mlm": params["generator_mlm"]}, ("mlm",)
  raise ValueError(f"electra_part={name!r}; choose one of {PARTS}.")
