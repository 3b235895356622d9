"""ALBERT and its BERT-family relatives as pure Flax linen modules.

One encoder serves every sharing strategy. Layer parameters live in two
stacks, `encoder/attention` and `encoder/ffn`, each with a leading `layers`
axis holding as many copies as the strategy stores (1 for ALBERT, L for BERT).
A single `nn.scan` walks the applied blocks: an unshared stack is scanned over
(slice i for block i), a shared stack is broadcast to every iteration and
indexed by the official group mapping. Depth therefore never unrolls into the
graph, and BERT is `share="none"` of the same code. GPT-1 is the same stack
with `causal` attention and the tied next-token "lm" head. The heads' modules
(`MLMHead`, `RTDHead`, `LMHead`) are in `albert_jax.lm_heads`.

Shapes: B batch, T sequence, H hidden, E embedding, V vocab, P predictions.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from albert_jax import layers
# The heads live in lm_heads; imported here so `models.MLMHead` etc. and
# every existing import keep working.
from albert_jax.lm_heads import gather_positions
from albert_jax.lm_heads import LMHead
from albert_jax.lm_heads import MLMHead
from albert_jax.lm_heads import RTDHead
from albert_jax.model_config import ModelConfig
from albert_jax.ops import attention as attention_ops

# The pre-training heads built by default; ALL_HEADS adds ELECTRA's
# replaced-token-detection head and the causal next-token head, which a model
# builds only when asked.
HEADS = ("mlm", "sop")
ALL_HEADS = ("mlm", "sop", "rtd", "lm")


def _constrain(x, names):
  """Activation sharding by logical name; `act_*` names have their own rules
  so an activation's hidden axis is not split the way a weight's is."""
  return nn.with_logical_constraint(x, tuple(f"act_{n}" for n in names))


class Embeddings(nn.Module):
  """word + position + token type → LayerNorm → dropout, all of width E."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    kw = dict(init_range=cfg.initializer_range, dtype=cfg.compute_dtype,
              param_dtype=cfg.parameter_dtype)
    self.word_embeddings = layers.Embed(
        cfg.vocab_size, cfg.embedding_size, axes=("vocab", "embedding"), **kw)
    self.position_embeddings = layers.Embed(
        cfg.max_position_embeddings, cfg.embedding_size,
        axes=("position", "embedding"), **kw)
    self.token_type_embeddings = layers.Embed(
        cfg.type_vocab_size, cfg.embedding_size,
        axes=("token_type", "embedding"), **kw)
    self.layer_norm = layers.LayerNorm(
        cfg.layer_norm_eps, axis_name="embedding", dtype=cfg.compute_dtype,
        param_dtype=cfg.parameter_dtype)
    self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

  def __call__(self, input_ids, token_type_ids, position_ids, deterministic):
    """[B, T] ids → [B, T, E]."""
    x = self.word_embeddings(input_ids)
    x = x + self.position_embeddings(position_ids)
    x = x + self.token_type_embeddings(token_type_ids)
    x = self.dropout(self.layer_norm(x), deterministic=deterministic)
    return _constrain(x, ("batch", "length", "embedding"))

  def attend(self, x):
    """[..., E] → [..., V] against the word embedding table."""
    return self.word_embeddings.attend(x)


class AttentionBlock(nn.Module):
  """Self-attention → dense → dropout → residual + LayerNorm (post-LN)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x, segment_ids, deterministic):
    """[B, T, H] → [B, T, H]; `segment_ids` [B, T], 0 = padding."""
    cfg = self.config
    kw = dict(init_range=cfg.initializer_range, dtype=cfg.compute_dtype,
              param_dtype=cfg.parameter_dtype)
    heads = (cfg.num_attention_heads, cfg.head_dim)
    qkv_axes = ("embed", "heads", "kv")
    q = layers.Dense(heads, qkv_axes, name="query", **kw)(x)
    k = layers.Dense(heads, qkv_axes, name="key", **kw)(x)
    v = layers.Dense(heads, qkv_axes, name="value", **kw)(x)
    q, k, v = (_constrain(t, ("batch", "length", "heads", "kv"))
               for t in (q, k, v))
    dropout = cfg.attention_probs_dropout_prob
    needs_rng = not deterministic and dropout > 0.0
    context = attention_ops.dot_product_attention(
        q, k, v, segment_ids=segment_ids, dropout_rate=dropout,
        dropout_rng=self.make_rng("dropout") if needs_rng else None,
        deterministic=deterministic, impl=cfg.attention_impl,
        causal=cfg.causal)
    y = layers.Dense((cfg.hidden_size,), ("heads", "kv", "embed"), contract=2,
                     name="output", **kw)(context)
    y = nn.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
    y = layers.LayerNorm(cfg.layer_norm_eps, dtype=cfg.compute_dtype,
                         param_dtype=cfg.parameter_dtype,
                         name="layer_norm")(x + y)
    return _constrain(y, ("batch", "length", "embed"))


class FFNBlock(nn.Module):
  """dense → activation → dense → dropout → residual + LayerNorm."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x, deterministic):
    """[B, T, H] → [B, T, H]."""
    cfg = self.config
    kw = dict(init_range=cfg.initializer_range, dtype=cfg.compute_dtype,
              param_dtype=cfg.parameter_dtype)
    y = layers.Dense((cfg.intermediate_size,), ("embed", "mlp"),
                     name="intermediate", **kw)(x)
    y = _constrain(y, ("batch", "length", "mlp"))
    output = layers.Dense((cfg.hidden_size,), ("mlp", "embed"), name="output",
                          **kw)
    act = layers.activation(cfg.hidden_act)
    # The activation is recomputed in the backward pass (one elementwise op)
    # so that only its input is kept, not also its output, which the output
    # matmul's weight gradient would otherwise hold: one [B, T, F] array per
    # layer instead of two. The matmul itself is not redone (its result is
    # not needed backwards).
    y = nn.checkpoint(lambda module, h: module(act(h)), prevent_cse=False)(
        output, y)
    y = nn.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
    y = layers.LayerNorm(cfg.layer_norm_eps, dtype=cfg.compute_dtype,
                         param_dtype=cfg.parameter_dtype,
                         name="layer_norm")(x + y)
    return _constrain(y, ("batch", "length", "embed"))


def _stack_init(block: nn.Module, copies: int, hidden_size: int):
  """Initialiser for `copies` independent sets of `block`'s parameters.

  Returns a pytree whose leaves carry a leading `layers` axis of size
  `copies`, with that axis added to their logical names.
  """
  def init(rng):
    dummy = jnp.zeros((1, 1, hidden_size), jnp.float32)
    def one(key):
      args = (dummy, None, True) if isinstance(block, AttentionBlock) else (
          dummy, True)
      return block.init(key, *args)["params"]
    stacked = jax.vmap(one)(jax.random.split(rng, copies))
    return nn.meta.add_axis(stacked, 0, {nn.PARTITION_NAME: "layers"})
  return init


class _Step(nn.Module):
  """One applied block (attention then FFN) with its parameters handed in."""
  config: ModelConfig

  @nn.compact
  def __call__(self, h, xs, shared, segment_ids, deterministic):
    cfg = self.config
    step_params, copy_index = xs
    params = {}
    for name in ("attention", "ffn"):
      if name in shared:
        stack = shared[name]
        if cfg.num_copies(name) == 1:
          params[name] = jax.tree.map(lambda p: p[0], stack)
        else:
          params[name] = jax.tree.map(
              lambda p, i=copy_index[name]: jax.lax.dynamic_index_in_dim(
                  p, i, keepdims=False), stack)
      else:
        params[name] = step_params[name]
    # Like nn.Dropout, ask for an rng only when some rate is non-zero, so a
    # dropout-free model runs with deterministic=False and no rngs.
    needs_rng = not deterministic and (
        cfg.hidden_dropout_prob > 0 or cfg.attention_probs_dropout_prob > 0)
    rngs = {"dropout": self.make_rng("dropout")} if needs_rng else None
    h = AttentionBlock(cfg, parent=None).apply(
        {"params": params["attention"]}, h, segment_ids, deterministic,
        rngs=rngs)
    rngs = {"dropout": self.make_rng("dropout")} if needs_rng else None
    h = FFNBlock(cfg, parent=None).apply(
        {"params": params["ffn"]}, h, deterministic, rngs=rngs)
    return h, None


_REMAT = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


class Encoder(nn.Module):
  """Optional E→H projection, then `num_steps` post-LN blocks in one scan."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x, segment_ids, deterministic):
    """[B, T, E] → [B, T, H]."""
    cfg = self.config
    if cfg.embedding_projection:
      x = layers.Dense((cfg.hidden_size,), ("embedding", "embed"),
                       init_range=cfg.initializer_range,
                       dtype=cfg.compute_dtype,
                       param_dtype=cfg.parameter_dtype,
                       name="embedding_hidden_mapping_in")(x)
    x = _constrain(x, ("batch", "length", "embed"))
    stacks = {
        "attention": self.param(
            "attention", _stack_init(AttentionBlock(cfg, parent=None),
                                     cfg.num_copies("attention"),
                                     cfg.hidden_size)),
        "ffn": self.param(
            "ffn", _stack_init(FFNBlock(cfg, parent=None),
                               cfg.num_copies("ffn"), cfg.hidden_size)),
    }
    shared = {k: v for k, v in stacks.items() if cfg.is_shared(k)}
    scanned = {k: v for k, v in stacks.items() if not cfg.is_shared(k)}
    copy_index = {k: jnp.asarray(np.asarray(cfg.copy_index(k), np.int32))
                  for k in shared}
    step = _Step
    if cfg.remat != "none":
      step = nn.remat(step, policy=_REMAT[cfg.remat], prevent_cse=False,
                      static_argnums=(5,))
    scan = nn.scan(step, variable_broadcast=False,
                   split_rngs={"dropout": True},
                   in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast),
                   length=cfg.num_steps)
    x, _ = scan(cfg, name="layers")(x, (scanned, copy_index), shared,
                                    segment_ids, deterministic)
    return x


def last_token_index(attention_mask: jax.Array) -> jax.Array:
  """[B, T] mask (0 = padding) → [B] index of each row's last non-padding
  token (0 for a row of padding only)."""
  positions = jnp.arange(attention_mask.shape[1], dtype=jnp.int32)
  return jnp.max(jnp.where(attention_mask != 0, positions, 0), axis=1)


def padding_position_ids(input_ids: jax.Array, pad_token_id: int
                         ) -> jax.Array:
  """RoBERTa's positions: [B, T] ids → [B, T] int32.

  Non-pad tokens count up from `pad_token_id + 1` in order; pad tokens (and
  only those, wherever they are) get `pad_token_id`.
  """
  real = (input_ids != pad_token_id).astype(jnp.int32)
  return jnp.cumsum(real, axis=1) * real + pad_token_id


class Albert(nn.Module):
  """The encoder with its pooler and pre-training heads.

  Attributes:
    config: the model's hyperparameters.
    pooler: build the pooler (dense + tanh) of the [CLS] token, or of the
      last non-padding token in a causal model (position 0 of a causal
      model has seen only itself; GPT-1 classifies from the final token).
    heads: which of "mlm" (tied masked-LM head), "sop" (2-way sentence
      head on the pooler: SOP for ALBERT, NSP for BERT), "rtd" (ELECTRA's
      per-token replaced-token detection) and "lm" (a causal model's tied
      next-token head) to build.
  """
  config: ModelConfig
  pooler: bool = True
  heads: tuple[str, ...] = HEADS

  def setup(self):
    unknown = set(self.heads) - set(ALL_HEADS)
    if unknown:
      raise ValueError(
          f"Unknown heads {sorted(unknown)}; choose from {ALL_HEADS}.")
    if "sop" in self.heads and not self.pooler:
      raise ValueError("The 'sop' head reads the pooled output; keep pooler.")
    self.config.check_heads(self.heads)

  @nn.compact
  def __call__(self,
               input_ids: jax.Array,
               token_type_ids: jax.Array | None = None,
               attention_mask: jax.Array | None = None,
               position_ids: jax.Array | None = None,
               masked_positions: jax.Array | None = None,
               deterministic: bool = True) -> dict[str, Any]:
    """Runs the model.

    Args:
      input_ids: [B, T] int token ids.
      token_type_ids: [B, T] segment A/B ids (default zeros).
      attention_mask: [B, T] int; 0 = padding. Values > 1 mark packed
        sequences: a token attends only to tokens with the same value.
      position_ids: [B, T] (default 0..T-1, or RoBERTa's from the padding
        with `config.position_ids_from_padding`; restart them per packed
        sequence).
      masked_positions: [B, P] int. If given, MLM logits are computed only
        at these positions ([B, P, V]); otherwise at all positions.
      deterministic: False enables dropout (needs the "dropout" rng).

    Returns:
      dict with "sequence_output" [B, T, H], and where built
      "pooled_output" [B, H], "mlm_logits" [B, T or P, V], "sop_logits" [B, 2],
      "rtd_logits" [B, T], "lm_logits" [B, T, V] (position t's scores for
      token t + 1).
    """
    cfg = self.config
    batch, length = input_ids.shape
    if length > cfg.max_length:
      if cfg.position_ids_from_padding:
        raise ValueError(
            f"Sequence length {length} exceeds {cfg.max_length}: positions "
            f"from padding start at pad_token_id + 1 = "
            f"{cfg.pad_token_id + 1}, and max_position_embeddings is "
            f"{cfg.max_position_embeddings}.")
      raise ValueError(
          f"Sequence length {length} exceeds max_position_embeddings "
          f"{cfg.max_position_embeddings}.")
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if position_ids is None and cfg.position_ids_from_padding:
      position_ids = padding_position_ids(input_ids, cfg.pad_token_id)
    elif position_ids is None:
      position_ids = jnp.broadcast_to(jnp.arange(length), (batch, length))
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    segment_ids = attention_mask.astype(jnp.int32)

    embeddings = Embeddings(cfg, name="embeddings")
    x = embeddings(input_ids, token_type_ids, position_ids, deterministic)
    x = Encoder(cfg, name="encoder")(x, segment_ids, deterministic)
    out = {"sequence_output": x}
    if self.pooler:
      if cfg.causal:
        summary = jnp.take_along_axis(
            x, last_token_index(attention_mask)[:, None, None], axis=1)[:, 0]
      else:
        summary = x[:, 0]
      pooled = layers.Dense((cfg.hidden_size,), ("embed", "embed_out"),
                            init_range=cfg.initializer_range,
                            dtype=cfg.compute_dtype,
                            param_dtype=cfg.parameter_dtype,
                            name="pooler")(summary)
      out["pooled_output"] = jnp.tanh(pooled)
    if "mlm" in self.heads:
      hidden = x if masked_positions is None else gather_positions(
          x, masked_positions)
      out["mlm_logits"] = MLMHead(cfg, name="mlm")(hidden, embeddings)
    if "sop" in self.heads:
      out["sop_logits"] = layers.Dense(
          (cfg.num_sentence_labels,), ("embed", "classes"),
          init_range=cfg.initializer_range, dtype=cfg.compute_dtype,
          param_dtype=cfg.parameter_dtype, name="sop")(out["pooled_output"])
    if "rtd" in self.heads:
      out["rtd_logits"] = RTDHead(cfg, name="rtd")(x)
    if "lm" in self.heads:
      out["lm_logits"] = LMHead(cfg, name="lm")(x, embeddings)
    return out
