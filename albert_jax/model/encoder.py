"""The encoder every model in the family shares: embeddings and a scanned
stack of post-LN blocks.

Layer parameters live in two stacks, `encoder/attention` and `encoder/ffn`,
each with a leading `layers` axis holding as many copies as the sharing
strategy stores (1 for ALBERT, L for BERT). A single `nn.scan` walks the
applied blocks: an unshared stack is scanned over (slice i for block i), a
shared stack is broadcast to every iteration and indexed by the official
group mapping. BERT is `share="none"` of the same code. The scan is a loop on
CPU (compile time flat in depth) and unrolled on GPU and TPU, where a loop's
stacked activations cost HBM traffic (`unrolls_layers`).

Shapes: B batch, T sequence, H hidden, E embedding.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from albert_jax.model import layers
from albert_jax.model.config import ModelConfig
from albert_jax.ops import attention as attention_ops


def _constrain(x, names):
  """Activation sharding by logical name; `act_*` names have their own rules
  so an activation's hidden axis is not split the way a weight's is."""
  return nn.with_logical_constraint(x, tuple(f"act_{n}" for n in names))


class Embeddings(nn.Module):
  """word + position + token type → LayerNorm → dropout, all of width E."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    kw = cfg.layer_kwargs
    self.word_embeddings = layers.Embed(
        cfg.vocab_size, cfg.embedding_size, axes=("vocab", "embedding"), **kw)
    self.position_embeddings = layers.Embed(
        cfg.max_position_embeddings, cfg.embedding_size,
        axes=("position", "embedding"), **kw)
    self.token_type_embeddings = layers.Embed(
        cfg.type_vocab_size, cfg.embedding_size,
        axes=("token_type", "embedding"), **kw)
    self.layer_norm = layers.LayerNorm(axis_name="embedding", **cfg.norm_kwargs)
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
  """Self-attention → dense → dropout → residual + LayerNorm (post-LN).

  Attributes:
    right_padded: every row of the segment ids is one sequence then padding
      (`attention.dot_product_attention`'s promise of that name).
  """
  config: ModelConfig
  right_padded: bool = False

  @nn.nowrap
  def project_qkv(self, x):
    """[B, T, H] → query, key, value [B, T, N, D] and the value's bias
    [N, D], not yet added: three `layers.Dense` named "query", "key" and
    "value".

    The key's bias is never added: it shifts every logit of a query row by
    the same q·b_k, which softmax removes (with any mask, causal or not, and
    with dropout on the probabilities), so the attention output does not
    depend on it and its gradient is zero. Leaving it out saves an
    elementwise pass over [B, T, H] forward and a reduction backward in
    every layer (ALBERT-large, H100 target: 2.4 GB and 1.1 ms modelled a
    step). The parameter stays, for checkpoints and converters.

    A seam for experiments/benchmarks/step_fixes.py, which replaces it on
    the class while a step is traced to time other ways of computing the
    same from the same parameters. Not wrapped by Flax: it runs as part of
    `__call__`, with the same names and ops as if written there.
    """
    cfg = self.config
    kw = cfg.layer_kwargs
    heads = (cfg.num_attention_heads, cfg.head_dim)
    qkv_axes = ("embed", "heads", "kv")
    q = layers.Dense(heads, qkv_axes, name="query", **kw)(x)
    k, _ = layers.Dense(heads, qkv_axes, name="key", **kw)(x, add_bias=False)
    v, v_bias = layers.Dense(heads, qkv_axes, name="value", **kw)(
        x, add_bias=False)
    return q, k, v, v_bias

  @nn.compact
  def __call__(self, x, segment_ids, deterministic):
    """[B, T, H] → [B, T, H]; `segment_ids` [B, T], 0 = padding."""
    cfg = self.config
    kw = cfg.layer_kwargs
    q, k, v, v_bias = self.project_qkv(x)
    dropout = cfg.attention_probs_dropout_prob
    needs_rng = not deterministic and dropout > 0.0
    # On GPU: each query's probabilities sum to 1, so the value's bias
    # comes out of attention unchanged and is added after the output
    # projection, as b_v·W_o, in the fusion that adds the output's bias and
    # the residual, instead of in a pass over [B, T, H] of its own
    # (ALBERT-large, H100 target: 1.6 GB and 0.7 ms modelled a step). Not
    # with dropout on the probabilities (they then no longer sum to 1).
    # Query rows that see no key (padding: segment id 0) come out of
    # attention as zeros and get no b_v·W_o, as before. The TPU compiler
    # does worse with it at ALBERT-large (v5e: +8.0 GB a step, though base
    # saves 4.8), so TPUs, and CPUs, add it to the values.
    fold = not needs_rng and layers.compile_platform() == "gpu"
    if not fold:
      v = v + v_bias
    q, k, v = (_constrain(t, ("batch", "length", "heads", "kv"))
               for t in (q, k, v))
    context = attention_ops.dot_product_attention(
        q, k, v, segment_ids=segment_ids, dropout_rate=dropout,
        dropout_rng=self.make_rng("dropout") if needs_rng else None,
        deterministic=deterministic, impl=cfg.attention_impl,
        causal=cfg.causal, right_padded=self.right_padded)
    output = layers.Dense((cfg.hidden_size,), ("heads", "kv", "embed"),
                          contract=2, name="output", **kw)
    y = output(context)
    if fold:
      value_bias, _ = output(v_bias, add_bias=False)  # [H] = b_v·W_o
      if segment_ids is not None:
        value_bias = value_bias * (segment_ids != 0)[..., None].astype(
            value_bias.dtype)
      y = y + value_bias
    y = nn.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
    y = layers.LayerNorm(**cfg.norm_kwargs,
                         name="layer_norm")(x + y)
    return _constrain(y, ("batch", "length", "embed"))


class FFNBlock(nn.Module):
  """dense → activation → dense → dropout → residual + LayerNorm.

  Attributes:
    unrolled: the block is one of several unrolled layers in one program
      (`Encoder`), not the body of a loop.
  """
  config: ModelConfig
  unrolled: bool = False
  # Whether the backward pass recomputes the activation (see `__call__`).
  # False only to measure the difference (experiments/benchmarks/
  # step_fixes.py sets it on the class while a step is traced).
  recompute_activation: ClassVar[bool] = True

  @nn.compact
  def __call__(self, x, deterministic):
    """[B, T, H] → [B, T, H]."""
    cfg = self.config
    kw = cfg.layer_kwargs
    # On GPU the first matmul's bias is added where the activation is
    # (inside the recomputed region), so that the saved activation input is
    # the GEMM's own output: with the bias added first, XLA:GPU writes the
    # biased copy the backward pass needs as a second array (ALBERT-large
    # at seq 512, batch 32 on an H100: 6.3 GB a step). On one v5e chip the
    # same change added 53 GB a step, so TPU and CPU add it first.
    late_bias = layers.compile_platform() == "gpu"
    y = layers.Dense((cfg.intermediate_size,), ("embed", "mlp"),
                     name="intermediate", **kw)(x, add_bias=not late_bias)
    y, bias = y if late_bias else (y, None)
    y = _constrain(y, ("batch", "length", "mlp"))
    output = layers.Dense((cfg.hidden_size,), ("mlp", "embed"), name="output",
                          **kw)
    named = layers.activation(cfg.hidden_act)

    def act(h):
      # Named so that a compiled step's kernels can be traced back to it
      # (tools.hlo_stats: the "activation" category).
      with jax.named_scope("activation"):
        return named(h)

    # The activation is recomputed in the backward pass (one elementwise op)
    # so that only its input is kept, not also its output, which the output
    # matmul's weight gradient would otherwise hold: one [B, T, F] array per
    # layer instead of two. The matmul itself is not redone (its result is
    # not needed backwards). Inside a loop body XLA cannot merge the
    # backward's recomputation with the forward's (they run in different
    # loops), so the CSE barrier is not needed; unrolled, without it XLA
    # merges them and keeps the activation's output after all (ALBERT-large
    # at seq 512, batch 32 on an H100: 16.0 GiB of temporaries instead of
    # 10.1).
    biased = lambda h, b: h if b is None else h + b  # noqa: E731
    if self.recompute_activation:
      y = nn.checkpoint(lambda module, h, b: module(act(biased(h, b))),
                        prevent_cse=self.unrolled)(output, y, bias)
    else:
      y = output(act(biased(y, bias)))
    y = nn.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
    y = layers.LayerNorm(**cfg.norm_kwargs,
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
    # A loop over the copies, not a vmap: the same draws, and each block
    # traced as it runs (under a vmap, a bias-free key or value projection
    # of the shared input carries its batch axis inside, which cuDNN's
    # batching rule refuses).
    stacked = jax.lax.map(one, jax.random.split(rng, copies))
    return nn.meta.add_axis(stacked, 0, {nn.PARTITION_NAME: "layers"})
  return init


class _Step(nn.Module):
  """One applied block (attention then FFN) with its parameters handed in."""
  config: ModelConfig
  unrolled: bool = False
  right_padded: bool = False

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
    h = AttentionBlock(cfg, self.right_padded, parent=None).apply(
        {"params": params["attention"]}, h, segment_ids, deterministic,
        rngs=rngs)
    rngs = {"dropout": self.make_rng("dropout")} if needs_rng else None
    h = FFNBlock(cfg, self.unrolled, parent=None).apply(
        {"params": params["ffn"]}, h, deterministic, rngs=rngs)
    return h, None


_REMAT = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def unrolls_layers(cfg: ModelConfig) -> bool:
  """Whether the encoder unrolls its layer scan (`ModelConfig.layer_loop`;
  "auto" unrolls on GPU and TPU and keeps the loop on CPU, and everywhere
  when a remat policy is set).

  In a loop, every activation the backward pass needs is a slice of a
  stacked [layers, ...] array, which XLA zero-fills, copies each layer's
  result into and copies back out of; unrolled, each is its own buffer.
  Compiled for one H100 (ALBERT-large, seq 512, batch 32, bf16) that is
  183 → 139 GB of HBM traffic and 12.0 → 10.1 GiB of temporaries per
  step, for one v5e chip 210 → 124 GB and 15.2 → 14.2 GiB (BENCHMARKS.md,
  "The layer loop"); compile time then grows with depth (26 s against 14 s
  for 24 layers on an H100 target). On CPU the loop keeps compile time flat
  in depth, which tests and CPU runs need more.

  Remat needs the loop: unrolled, XLA schedules each layer's recomputation
  beside its forward pass and every activation stays live, so nothing is
  saved (ALBERT-base on v4-64, FSDP, remat full: 28.9 GiB a chip unrolled
  against 3.8 in the loop; on CPU the same temporaries as without remat).
  `ModelConfig` refuses "unroll" with a remat policy.
  """
  if cfg.layer_loop == "auto":
    return (layers.compile_platform() in ("gpu", "tpu")
            and cfg.remat == "none")
  return cfg.layer_loop == "unroll"


class Encoder(nn.Module):
  """Optional E→H projection, then `num_steps` post-LN blocks in one scan
  (unrolled or not: `unrolls_layers`)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x, segment_ids, deterministic, right_padded=False):
    """[B, T, E] → [B, T, H]; `segment_ids` [B, T], 0 = padding, and
    `right_padded` the promise that each row is one sequence then padding
    (`attention.dot_product_attention`)."""
    cfg = self.config
    if cfg.embedding_projection:
      x = layers.Dense((cfg.hidden_size,), ("embedding", "embed"),
                       **cfg.layer_kwargs,
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
    unroll = unrolls_layers(cfg)
    step = _Step
    if cfg.remat != "none":
      step = nn.remat(step, policy=_REMAT[cfg.remat], prevent_cse=False,
                      static_argnums=(5,))
    scan = nn.scan(step, variable_broadcast=False,
                   split_rngs={"dropout": True},
                   in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast),
                   length=cfg.num_steps, unroll=True if unroll else 1)
    x, _ = scan(cfg, unroll, right_padded, name="layers")(
        x, (scanned, copy_index), shared, segment_ids, deterministic)
    return x


def last_token_index(attention_mask: jax.Array) -> jax.Array:
  """[B, T] mask (0 = padding) → [B] index of each row's last non-padding
  token (0 for a row of padding only)."""
  positions = jnp.arange(attention_mask.shape[1], dtype=jnp.int32)
  return jnp.max(jnp.where(attention_mask != 0, positions, 0), axis=1)


def position_ids(cfg: ModelConfig, input_ids: jax.Array,
                 attention_mask: jax.Array | None = None) -> jax.Array:
  """The model's default positions: [B, T] ids → [B, T] int32.

  0..T-1, or with `cfg.position_ids_from_padding` RoBERTa's: the real
  tokens count up from `pad_token_id + 1` in order and the others sit at
  `pad_token_id`. A token is real where `attention_mask` is non-zero, or
  (without a mask, as transformers decides) where its id is not the pad id.
  Counting from the mask keeps a masked-LM batch's positions where they
  were when masking replaced a token by a random `<pad>`.
  """
  batch, length = input_ids.shape
  if not cfg.position_ids_from_padding:
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32),
                            (batch, length))
  real = (input_ids != cfg.pad_token_id) if attention_mask is None else (
      attention_mask != 0)
  real = real.astype(jnp.int32)
  return jnp.cumsum(real, axis=1) * real + cfg.pad_token_id


def segment_position_ids(cfg: ModelConfig, attention_mask: jax.Array
                         ) -> jax.Array:
  """Positions that restart at every packed sequence: [B, T] mask (0 =
  padding, equal non-zero values = one sequence, each a contiguous run) →
  [B, T] int32.

  Each sequence's tokens count 0, 1, ... from its first token (with
  `cfg.position_ids_from_padding`, from `pad_token_id + 1`, padding at
  `pad_token_id`), so a sequence packed at offset o is embedded exactly as
  it would be alone in a row.
  """
  mask = attention_mask.astype(jnp.int32)
  t = jnp.arange(mask.shape[1], dtype=jnp.int32)
  starts = jnp.concatenate([jnp.ones_like(mask[:, :1], bool),
                            mask[:, 1:] != mask[:, :-1]], axis=1)
  first = jax.lax.cummax(jnp.where(starts, t, 0), axis=1)
  offset = t - first
  if not cfg.position_ids_from_padding:
    return offset
  return jnp.where(mask != 0, offset + cfg.pad_token_id + 1,
                   cfg.pad_token_id)
