"""ELECTRA's two models: a small generator and a discriminator, one embedding.

The generator is a masked LM a fraction of the discriminator's width; it
fills the masked positions with tokens sampled from its own predictions
(Gumbel-max, no gradient through the sample). The discriminator reads the
corrupted text and says, for every real token, whether it was replaced; a
sampled token equal to the original counts as not replaced. Both read one
`Embeddings` module, so the token, position and type tables are stored once
and trained by both losses (the loss: `albert_jax.training.electra`).

The parameter tree is `Albert(config, pooler=False, heads=("rtd",))`'s
("embeddings", "encoder", "rtd": the discriminator, HF's
ElectraForPreTraining) plus "generator_encoder" and "generator_mlm", so the
discriminator loads and exports with the code every other model uses.

Shapes: B batch, T sequence, P masked slots, V vocab, H hidden.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from albert_jax.model import albert as albert_lib
from albert_jax.model import encoder as encoder_lib
from albert_jax.model import heads as heads_lib
from albert_jax.model.config import ModelConfig

# The checkpoint's parts, as `load_pretrained(..., electra_part=...)` names
# them.
PARTS = ("discriminator", "generator")


def check_fraction(fraction) -> None:
  """Raises ValueError unless `fraction` is a number in (0, 1]."""
  if (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
      or not 0.0 < fraction <= 1.0):
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
    self.embeddings = encoder_lib.Embeddings(self.config)
    self.encoder = encoder_lib.Encoder(self.config)
    self.rtd = heads_lib.RTDHead(self.config)
    self.generator_encoder = encoder_lib.Encoder(self.generator)
    # Tied to the shared word table through `self.embeddings`.
    self.generator_mlm = heads_lib.MLMHead(self.generator)

  def generate(self, input_ids, token_type_ids, position_ids, segment_ids,
               masked_positions, deterministic: bool,
               right_padded: bool = False):
    """The generator's logits [B, P, V] at `masked_positions` [B, P] of the
    masked input `input_ids` [B, T]."""
    x = self.embeddings(input_ids, token_type_ids, position_ids,
                        deterministic)
    h = self.generator_encoder(x, segment_ids, deterministic, right_padded)
    return self.generator_mlm(heads_lib.gather_positions(h, masked_positions),
                              self.embeddings)

  def discriminate(self, input_ids, token_type_ids, position_ids,
                   segment_ids, deterministic: bool,
                   right_padded: bool = False):
    """([B, T, H] sequence output, [B, T] replaced-token logits)."""
    x = self.embeddings(input_ids, token_type_ids, position_ids,
                        deterministic)
    h = self.encoder(x, segment_ids, deterministic, right_padded)
    return h, self.rtd(h)

  def __call__(self,
               input_ids: jax.Array,
               masked_positions: jax.Array,
               masked_ids: jax.Array,
               masked_weights: jax.Array,
               token_type_ids: jax.Array | None = None,
               attention_mask: jax.Array | None = None,
               temperature: float = 1.0,
               deterministic: bool = True,
               right_padded: bool = False) -> dict[str, jax.Array]:
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
      right_padded: every row of `attention_mask` is one sequence then
        padding (`albert.Albert`'s promise of that name).

    Returns:
      dict of "mlm_logits" [B, P, V] (generator), "sampled_ids" [B, P],
      "original_ids" and "fake_ids" [B, T] (the text before masking and the
      discriminator's input), "sequence_output" [B, T, H] and "rtd_logits"
      [B, T] (discriminator).
    """
    cfg = self.config
    albert_lib.check_ids(input_ids, cfg.vocab_size)
    length = input_ids.shape[1]
    if length > cfg.max_length:
      raise ValueError(f"Sequence length {length} exceeds the model's "
                       f"{cfg.max_length} positions.")
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    original = scatter_masked(input_ids, masked_positions, masked_weights,
                              masked_ids)
    # From the original text: a sampled pad id cannot move them.
    position_ids = encoder_lib.position_ids(cfg, original)
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    if right_padded:
      albert_lib.check_right_padded(attention_mask)
    segment_ids = attention_mask.astype(jnp.int32)
    mlm_logits = self.generate(input_ids, token_type_ids, position_ids,
                               segment_ids, masked_positions, deterministic,
                               right_padded)
    sampled = gumbel_max_sample(self.make_rng("sample"), mlm_logits,
                                temperature)
    fake = scatter_masked(original, masked_positions, masked_weights, sampled)
    sequence, rtd_logits = self.discriminate(
        fake, token_type_ids, position_ids, segment_ids, deterministic,
        right_padded)
    return {"mlm_logits": mlm_logits, "sampled_ids": sampled,
            "original_ids": original, "fake_ids": fake,
            "sequence_output": sequence, "rtd_logits": rtd_logits}


def part(params: Mapping[str, Any], disc: ModelConfig,
         generator: ModelConfig, name: str
         ) -> tuple[ModelConfig, dict[str, Any], tuple[str, ...]]:
  """One half of an ELECTRA parameter tree as a stand-alone `Albert`.

  Args:
    params: `Electra`'s parameters.
    disc, generator: the discriminator's and the generator's configs.
    name: "discriminator" → (config, {embeddings, encoder, rtd}, ("rtd",));
      "generator" → (generator config, {embeddings, encoder, mlm},
      ("mlm",)). Either is `Albert(config, pooler=False, heads)`'s tree.
  """
  if name == "discriminator":
    return disc, {k: params[k] for k in ("embeddings", "encoder", "rtd")}, (
        "rtd",)
  if name == "generator":
    return generator, {
        "embeddings": params["embeddings"],
        "encoder": params["generator_encoder"],
        "mlm": params["generator_mlm"]}, ("mlm",)
  raise ValueError(f"electra_part={name!r}; choose one of {PARTS}.")
