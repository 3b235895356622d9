"""ALBERT's LAMB, AdamW and learning-rate schedule, as officially coded.

Differences from `optax.lamb` that matter for reproducing ALBERT:
- no bias correction of the moments (the official `lamb_optimizer.py` has
  none); `bias_correction=True` restores Adam's;
- parameters whose path matches `LayerNorm|layer_norm|bias` are excluded
  from weight decay *and* from the trust ratio (optax's mask covers only the
  decay);
- the trust ratio ‖w‖/‖update‖ is taken per layer: a stacked parameter
  ([copies, ...], BERT's unshared layers) gets one ratio per copy, as the
  official per-variable computation gives for separate layers;
- the schedule decays polynomially from step 0 over `num_train_steps`, and
  linear warmup overrides it while step < warmup (`optax.join_schedules`
  would restart the decay after warmup).

`optimizer.schedule="cosine"` gives GPT-1's schedule instead: linear warmup
from 0, then a cosine anneal to `end_learning_rate` at `num_train_steps`.

`optimizer.layerwise_lr_decay` d < 1 (fine-tuning an unshared stack only)
scales each parameter's step as ELECTRA's `_get_layer_lrs` does
(`layer_lr_multipliers`): lower layers, nearer the input, move less.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from albert_jax import tree as tree_lib

EXCLUDE_PATTERN = r"LayerNorm|layer_norm|bias"
# Parameter stacks whose leading axis indexes separate layers.
STACKED_PATTERN = r"^encoder/(attention|ffn)/"


def path_mask(tree, pattern: str, match: bool = True) -> Any:
  """Bool pytree: whether each leaf's path matches `pattern` (or not)."""
  regex = re.compile(pattern)
  return jax.tree.map(lambda n: bool(regex.search(n)) == match,
                      tree_lib.paths(tree))


def albert_schedule(peak: float, num_train_steps: int, warmup_steps: int,
                    end: float = 0.0, power: float = 1.0,
                    start_warmup_step: int = 0) -> optax.Schedule:
  """The official schedule: polynomial decay over all steps, warmup on top."""
  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    frac = jnp.minimum(step, num_train_steps) / max(num_train_steps, 1)
    decayed = (peak - end) * (1.0 - frac) ** power + end
    if warmup_steps <= 0:
      return decayed
    warm_step = step - start_warmup_step
    warm = peak * warm_step / warmup_steps
    return jnp.where(warm_step < warmup_steps, warm, decayed)
  return schedule


def cosine_schedule(peak: float, num_train_steps: int, warmup_steps: int,
                    end: float = 0.0) -> optax.Schedule:
  """GPT-1's schedule: linear warmup from 0 to `peak` over `warmup_steps`,
  then a half cosine from `peak` to `end` ending at `num_train_steps` (held
  at `end` after). The same values as `optax.warmup_cosine_decay_schedule(
  0, peak, warmup_steps, num_train_steps, end)`."""
  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    frac = jnp.clip((step - warmup_steps)
                    / max(num_train_steps - warmup_steps, 1), 0.0, 1.0)
    decayed = end + (peak - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * frac))
    if warmup_steps <= 0:
      return decayed
    warm = peak * step / warmup_steps
    return jnp.where(step < warmup_steps, warm, decayed)
  return schedule


SCHEDULES = ("polynomial", "cosine")

# Where `layer_lr_multipliers` finds the encoder's parts, with or without a
# fine-tuning model's "albert/" scope.
_EMBEDDING_PARTS = (r"^(albert/)?(embeddings|"
                    r"encoder/embedding_hidden_mapping_in)/")
_LAYER_STACKS = r"^(albert/)?encoder/(attention|ffn)/"
_POOLER = r"^(albert/)?pooler/"


def layer_lr_multipliers(params, model_config, decay: float) -> Any:
  """Per-parameter learning-rate factors of ELECTRA's layer-wise decay.

  ELECTRA's `_get_layer_lrs` (model/optimization.py) gives each part a depth
  and the rate lr × decay^(L + 2 − depth), L = num_hidden_layers: the
  embeddings (and their E→H projection) depth 0, layer i (0-based) depth
  i + 1, the task head depth L + 2. So the head trains at the full rate, the
  top layer at decay², the bottom layer at decay^(L+1) and the embeddings at
  decay^(L+2). ELECTRA has no pooler; here it sits between the top layer and
  the head at the depth ELECTRA leaves free, L + 1 (factor decay). Any other
  parameter (the head, a next-token head) is task-specific: factor 1.

  Args:
    params: the parameter pytree (or one of its structure, e.g. updates).
    model_config: the encoder's `ModelConfig`; its stacks must be unshared
      (`share="none"`), each copy being one block of one layer.
    decay: the factor per layer, in (0, 1].

  Returns:
    A pytree like `params` of float32 factors: scalars, and for the layer
    stacks [copies, 1, ...] arrays, one factor per copy (copy c is applied
    block c of layer c // inner_group_num).

  Raises:
    ValueError: a shared stack (one parameter set serves several layers, so
      it has no one depth).
  """
  shared = [c for c in ("attention", "ffn") if model_config.is_shared(c)]
  if shared and decay != 1:
    raise ValueError(
        f"optimizer.layerwise_lr_decay={decay} needs a layer's own "
        f"parameters, but model.share={model_config.share!r} shares the "
        f"{' and '.join(shared)} parameters: one set serves every layer, so "
        "it has no depth to decay by; leave --config.optimizer."
        "layerwise_lr_decay=1.0, or fine-tune an unshared (share='none') "
        "model.")
  layers = model_config.num_hidden_layers
  inner = model_config.inner_group_num

  def factor(path: str, leaf) -> Any:
    if re.search(_EMBEDDING_PARTS, path):
      return jnp.float32(decay ** (layers + 2))
    if re.search(_LAYER_STACKS, path):
      depth = np.arange(leaf.shape[0]) // inner + 1
      rates = (decay ** (layers + 2 - depth)).astype(np.float32)
      return jnp.asarray(rates.reshape((-1,) + (1,) * (len(leaf.shape) - 1)))
    if re.search(_POOLER, path):
      return jnp.float32(decay)
    return jnp.float32(1.0)

  return jax.tree.map(factor, tree_lib.paths(params), params)


def scale_by_layer(model_config, decay: float) -> optax.GradientTransformation:
  """Multiplies each update by its `layer_lr_multipliers` factor."""
  def init(params):
    layer_lr_multipliers(params, model_config, decay)  # refuse shared early
    return optax.EmptyState()

  def update(updates, state, params=None):
    del params
    factors = layer_lr_multipliers(updates, model_config, decay)
    return jax.tree.map(lambda u, f: (u * f).astype(u.dtype), updates,
                        factors), state

  return optax.GradientTransformation(init, update)


class ScaleByAdamState(NamedTuple):
  count: jax.Array
  mu: Any
  nu: Any


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
                  bias_correction: bool = False
                  ) -> optax.GradientTransformation:
  """m / (√v + ε), with or without Adam's bias correction."""
  def init(params):
    # Two separate trees: if mu and nu were one set of buffers, a state built
    # outside jit could not be donated (the same buffer would go twice).
    zeros = lambda: jax.tree.map(  # noqa: E731
        lambda p: jnp.zeros_like(p, jnp.float32), params)
    return ScaleByAdamState(jnp.zeros([], jnp.int32), zeros(), zeros())

  def update(updates, state, params=None):
    del params
    count = state.count + 1
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g),
                      state.nu, updates)
    if bias_correction:
      c1 = 1 - b1 ** count.astype(jnp.float32)
      c2 = 1 - b2 ** count.astype(jnp.float32)
      out = jax.tree.map(lambda m, v: (m / c1) / (jnp.sqrt(v / c2) + eps),
                         mu, nu)
    else:
      out = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return out, ScaleByAdamState(count, mu, nu)

  return optax.GradientTransformation(init, update)


def scale_by_layerwise_trust_ratio(stacked: Any
                                   ) -> optax.GradientTransformation:
  """update · ‖w‖/‖update‖ per layer; 1 where either norm is zero.

  Args:
    stacked: bool pytree (or callable params → pytree); True leaves are
      [copies, ...] stacks whose norms are taken per copy.
  """
  def init(params):
    del params
    return optax.EmptyState()

  def update(updates, state, params):
    flags = stacked(params) if callable(stacked) else stacked

    def ratio(u, w, is_stacked):
      # A stack's copies are separate variables in the official code, so the
      # norms run over every axis but the first (none for a [copies] vector:
      # each element is then its own layer).
      axes = tuple(range(1, w.ndim)) if is_stacked else None
      w_norm = jnp.sqrt(jnp.sum(jnp.square(w.astype(jnp.float32)), axis=axes,
                                keepdims=axes is not None))
      u_norm = jnp.sqrt(jnp.sum(jnp.square(u.astype(jnp.float32)), axis=axes,
                                keepdims=axes is not None))
      r = jnp.where((w_norm > 0) & (u_norm > 0),
                    w_norm / jnp.where(u_norm > 0, u_norm, 1.0), 1.0)
      return (u * r).astype(u.dtype)

    return jax.tree.map(ratio, updates, params, flags), state

  return optax.GradientTransformation(init, update)


def lamb(learning_rate: optax.ScalarOrSchedule, *, b1: float = 0.9,
         b2: float = 0.999, eps: float = 1e-6, weight_decay: float = 0.01,
         exclude: str = EXCLUDE_PATTERN, bias_correction: bool = False,
         stacked: str = STACKED_PATTERN) -> optax.GradientTransformation:
  """The official ALBERT LAMB (see the module docstring)."""
  decay = lambda p: path_mask(p, exclude, match=False)  # noqa: E731
  return optax.chain(
      scale_by_adam(b1, b2, eps, bias_correction),
      optax.add_decayed_weights(weight_decay, mask=decay),
      optax.masked(scale_by_layerwise_trust_ratio(
          lambda p: path_mask(p, stacked)), decay),
      optax.scale_by_learning_rate(learning_rate),
  )


def adamw(learning_rate: optax.ScalarOrSchedule, *, b1: float = 0.9,
          b2: float = 0.999, eps: float = 1e-6, weight_decay: float = 0.01,
          exclude: str = EXCLUDE_PATTERN, bias_correction: bool = False
          ) -> optax.GradientTransformation:
  """The official AdamW: decoupled decay, same exclusions, no bias corr."""
  decay = lambda p: path_mask(p, exclude, match=False)  # noqa: E731
  return optax.chain(
      scale_by_adam(b1, b2, eps, bias_correction),
      optax.add_decayed_weights(weight_decay, mask=decay),
      optax.scale_by_learning_rate(learning_rate),
  )


OPTIMIZERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    "lamb": lamb, "adamw": adamw}
NAMES = tuple(sorted(OPTIMIZERS))  # config.optimizer.name's choices


def check(optimizer_config, *, job: str, num_train_steps: int | None
          ) -> None:
  """Refuses optimizer values that cannot train, before anything is
  written: one line naming each bad key, its value, what is allowed and the
  fix.

  Args:
    optimizer_config: the run's `config.optimizer` section.
    job: `config.job`; layer-wise decay is for "finetune" only.
    num_train_steps: `config.num_train_steps` (None: the config has none).

  Raises:
    ValueError: e.g. "config.optimizer.learning_rate=-0.001 must be a
      finite number > 0, e.g. --config.optimizer.learning_rate=0.001."
  """
  o = optimizer_config
  rules = (  # key, test, what is allowed, an example
      ("learning_rate", lambda v: v > 0, "a finite number > 0", 1e-3),
      ("end_learning_rate", lambda v: v >= 0, "a finite number >= 0", 0.0),
      ("b1", lambda v: 0 <= v < 1, "in [0, 1)", 0.9),
      ("b2", lambda v: 0 <= v < 1, "in [0, 1)", 0.999),
      ("eps", lambda v: v > 0, "a finite number > 0", 1e-6),
      ("weight_decay", lambda v: v >= 0, "a finite number >= 0", 0.01),
      ("clip_norm", lambda v: v >= 0, "a finite number >= 0 (0: no "
       "clipping)", 1.0),
      ("power", lambda v: v > 0, "a finite number > 0", 1.0),
      ("warmup_steps", lambda v: v >= 0 and v == int(v), "a whole number "
       ">= 0", 0),
      ("layerwise_lr_decay", lambda v: 0 < v <= 1, "in (0, 1] (1: no "
       "decay)", 1.0))
  problems = []
  for key, ok, allowed, example in rules:
    if key not in o:
      continue
    value = o[key]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and ok(value)):
      problems.append(f"config.optimizer.{key}={value!r} must be {allowed}, "
                      f"e.g. --config.optimizer.{key}={example}")
  decay = o.layerwise_lr_decay
  if job != "finetune" and decay != 1:
    # ELECTRA decays the rates when fine-tuning; pre-training trains every
    # layer from scratch, where slower lower layers would only lag.
    problems.append(f"config.optimizer.layerwise_lr_decay={decay!r} is for "
                    "fine-tuning; a pre-training run keeps it at 1.0")
  steps = num_train_steps
  if steps is not None and not (isinstance(steps, int) and steps >= 0):
    problems.append(f"config.num_train_steps={steps!r} must be a whole "
                    "number >= 0")
  if problems:
    raise ValueError("; ".join(problems) + ".")


def make(optimizer_config, num_train_steps: int, model_config=None
         ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Optimizer and schedule from the run's `config.optimizer` section and
  its `config.num_train_steps`, over which the schedule runs.

  Reads: optimizer_config.{name, learning_rate, warmup_steps,
  end_learning_rate, power, b1, b2, eps, weight_decay, bias_correction,
  clip_norm}; its schedule ("polynomial", ALBERT's, or "cosine", GPT-1's;
  `power` applies to the polynomial only); its layerwise_lr_decay (1.0:
  off), which needs `model_config`, the encoder's `ModelConfig`
  (`layer_lr_multipliers`).
  """
  o = optimizer_config
  if o.name not in OPTIMIZERS:
    raise ValueError(f"optimizer.name={o.name!r}; choose one of "
                     f"{sorted(OPTIMIZERS)}.")
  kind = o.schedule
  if kind not in SCHEDULES:
    raise ValueError(f"optimizer.schedule={kind!r}; choose one of "
                     f"{SCHEDULES}.")
  if kind == "cosine":
    schedule = cosine_schedule(o.learning_rate, num_train_steps,
                               o.warmup_steps, o.end_learning_rate)
  else:
    schedule = albert_schedule(o.learning_rate, num_train_steps,
                               o.warmup_steps, o.end_learning_rate, o.power)
  tx = OPTIMIZERS[o.name](schedule, b1=o.b1, b2=o.b2, eps=o.eps,
                          weight_decay=o.weight_decay,
                          bias_correction=o.bias_correction)
  decay = o.layerwise_lr_decay
  if decay != 1:
    if model_config is None:
      raise ValueError(f"optimizer.layerwise_lr_decay={decay} needs the "
                       "model's layers; it applies to fine-tuning only.")
    layer_lr_multipliers({}, model_config, decay)  # refuse shared stacks now
    tx = optax.chain(tx, scale_by_layer(model_config, decay))
  if o.clip_norm and o.clip_norm > 0:
    tx = optax.chain(optax.clip_by_global_norm(o.clip_norm), tx)
  return tx, schedule
