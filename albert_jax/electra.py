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

Shapes: B batch, T sequence, P masked slots, V vocab, H hidden.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from albert_jax import flops as flops_lib
from albert_jax import models
from albert_jax import objectives
from albert_jax.model_config import ModelConfig

# ELECTRA's guard on both loss denominators (ALBERT's MLM uses 1e-5).
EPS = 1e-6
# Eval samples come from this key folded with a checksum of the batch.
EVAL_SEED = 918_273
# The checkpoint's parts, as `load_pretrained(..., electra_part=...)` names
# them.
PARTS = ("discriminator", "generator")


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
    check_fraction(self.generator_fraction)
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
  def from_config(cls, config: Any) -> "ElectraOptions":
    """From a run config's `electra` section (a ConfigDict or JSON dict)."""
    section = config.get("electra") if hasattr(config, "get") else None
    if section is None:
      raise ValueError(
          "config.pretraining='electra' needs a config.electra section "
          f"with {[f.name for f in dataclasses.fields(cls)]}; start from "
          "configs/electra_small.py.")
    values = dict(section)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in values if k not in names]
    if unknown:
      hints = [k + "".join(f" (did you mean {c}?)" for c in
                           difflib.get_close_matches(k, names, n=1))
               for k in unknown]
      raise ValueError(f"Unknown config.electra keys: {', '.join(hints)}; "
                       f"valid: {names}.")
    return cls(**values)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_fraction(fraction) -> None:
  """Raises ValueError unless `fraction` is a number in (0, 1]."""
  if not _is_number(fraction) or not 0.0 < fraction <= 1.0:
    raise ValueError(
        f"config.electra.generator_fraction must be in (0, 1]: the "
        f"generator's hidden size as a fraction of the discriminator's "
        f"(the paper: 0.25, 1/3 for base); got {fraction!r}.")


def generator_config(disc: ModelConfig, fraction: float) -> ModelConfig:
  """The generator's hyperparameters, derived as the official code does.

  Hidden size round(fraction · H), heads max(1, hidden // 64), FFN 4·hidden,
  the same depth, sharing, embedding width, vocabulary, positions, dropout
  and dtypes. Where the heads do not divide the hidden size, it moves to the
  nearest multiple of them. An E→H projection exists exactly when the
  generator's width differs from the shared embeddings'.

  Raises:
    ValueError: `fraction` is not in (0, 1].
  """
  check_fraction(fraction)
  hidden = max(1, round(fraction * disc.hidden_size))
  heads = max(1, hidden // 64)
  hidden = max(heads, round(hidden / heads) * heads)
  return dataclasses.replace(
      disc, hidden_size=hidden, num_attention_heads=heads,
      intermediate_size=4 * hidden,
      embedding_projection=hidden != disc.embedding_size)


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


def rtd_head_flops(cfg: ModelConfig, seq_len: int) -> int:
  """Forward FLOPs of the replaced-token head on one sequence: dense H→H
  and H→1 at every position."""
  return seq_len * (2 * cfg.hidden_size * cfg.hidden_size
                    + 2 * cfg.hidden_size)


def training_flops_per_step(disc: ModelConfig, generator: ModelConfig,
                            batch: int, seq_len: int,
                            num_predictions: int) -> int:
  """Forward + backward FLOPs of one ELECTRA step (see `flops`).

  Generator: its encoder (with its own E→H projection) and the MLM head at
  the masked positions. Discriminator: its encoder and the RTD head at all
  T positions. Both are trained, so both cost 3 × forward; the sampling is
  elementwise and not counted.
  """
  gen = flops_lib.forward_flops_per_sequence(
      generator, seq_len, num_predictions, pooler=False, heads=("mlm",))
  dis = flops_lib.forward_flops_per_sequence(
      disc, seq_len, 0, pooler=False, heads=()) + rtd_head_flops(
          disc, seq_len)
  return flops_lib.TRAINING_MULTIPLIER * batch * (gen + dis)


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


def pretraining_config(model, *, generator_fraction: float, **run: Any):
  """An ELECTRA run's ConfigDict around a model section (the
  discriminator's): `config_lib.base_config(model, **run)` with ELECTRA's
  data, masking, optimizer and `electra` section.

  Masking is token-level, 15%, and each chosen token becomes [MASK] (85%)
  or stays itself (15%), never a random token. ELECTRA has no sentence-pair
  task: its data builder packs consecutive sentences of one document, in
  order and without a label; the nearest instances here are RoBERTa's packed
  full sentences (`data.objective="none"`), which may also cross documents.
  """
  import ml_collections  # pylint: disable=g-import-not-at-top
  from albert_jax import config_lib  # pylint: disable=g-import-not-at-top
  c = config_lib.base_config(model, objective="none", optimizer="adamw",
                             **run)
  c.pretraining = "electra"
  c.electra = ml_collections.ConfigDict(dataclasses.asdict(
      ElectraOptions(generator_fraction=generator_fraction)))
  c.masking.update(dict(max_ngram=1, whole_word=False, mask_token_prob=0.85,
                        random_token_prob=0.0))
  # The discriminator's accuracy is no measure of progress (its task gets
  # harder as the generator improves); the generator's rises steadily.
  c.best_metric = "mlm_accuracy"
  return c


def smoke_run(c) -> None:
  """Shrinks a config's run, in place, to a CPU smoke test of a minute or so:
  20 steps of 8 × 32 tokens, evaluated and checkpointed at 10 and 20."""
  c.batch_size = 8
  c.num_train_steps = 20
  c.optimizer.warmup_steps = 2
  c.data.max_seq_length = 32
  c.data.eval_fraction = 0.2
  c.masking.max_predictions = 5
  c.log_every_steps = 5
  c.eval_every_steps = c.checkpoint_every_steps = 10
  c.eval_batches = 2
