"""The train state, created already sharded, and the jitted train/eval steps.

State is a plain dict pytree: {"step", "params", "opt_state", "rng"}. Its
shardings come from the parameters' logical axis names through the config's
rules; `jax.jit(init, out_shardings=...)` materialises it in place, so no
device ever holds a full replica it does not need. The train step is jitted
with explicit in/out shardings and donates the old state.

Gradient accumulation runs inside the step as a `lax.scan` over
micro-batches. Each micro-batch's loss is normalised by the whole batch's
denominators (masked positions, sentence labels), so the summed gradients are
exactly those of the full batch.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from albert_jax import objectives
from albert_jax import sharding as sharding_lib

State = dict[str, Any]
BATCH_KEYS = ("input_ids", "token_type_ids", "attention_mask",
              "masked_positions", "masked_ids", "masked_weights",
              "sentence_labels")


def state_init_fn(init_params: Callable[[jax.Array], Any],
                  tx: optax.GradientTransformation
                  ) -> Callable[[jax.Array], State]:
  """rng → fresh state, from rng → boxed (logically named) parameters."""
  def init(rng):
    param_rng, state_rng = jax.random.split(rng)
    params = init_params(param_rng)
    return {
        "step": jnp.zeros([], jnp.int32),
        "params": params,
        "opt_state": tx.init(nn.meta.unbox(params)),
        "rng": jax.random.key_data(state_rng),
    }
  return init


def init_fn(model: nn.Module, tx: optax.GradientTransformation,
            seq_len: int, num_predictions: int) -> Callable[[jax.Array], State]:
  """rng → fresh pre-training state with boxed parameters."""
  def init_params(rng):
    ids = jnp.zeros((1, seq_len), jnp.int32)
    return model.init(rng, ids, masked_positions=jnp.zeros(
        (1, num_predictions), jnp.int32))["params"]
  return state_init_fn(init_params, tx)


def create_state(model: nn.Module, tx: optax.GradientTransformation, mesh,
                 rules, rng: jax.Array, seq_len: int, num_predictions: int,
                 compiler_options: dict[str, Any] | None = None
                 ) -> tuple[State, State]:
  """Initialises the pre-training state directly into its shardings.

  Args:
    compiler_options: passed to `jax.jit` (e.g. a lower XLA optimisation
      level where compile time matters more than speed, as in tests).

  Returns:
    (state, shardings), both with unboxed parameters.
  """
  return create_state_with(init_fn(model, tx, seq_len, num_predictions), tx,
                           mesh, rules, rng, compiler_options)


def create_state_with(init: Callable[[jax.Array], State],
                      tx: optax.GradientTransformation, mesh, rules,
                      rng: jax.Array,
                      compiler_options: dict[str, Any] | None = None
                      ) -> tuple[State, State]:
  """`create_state` for any `state_init_fn`-style initialiser."""
  abstract = jax.eval_shape(init, rng)
  shardings = state_shardings(abstract, tx, mesh, rules)

  def unboxed_init(r):
    s = init(r)
    return {**s, "params": nn.meta.unbox(s["params"])}

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state = jax.jit(unboxed_init, out_shardings=shardings,
                    compiler_options=compiler_options)(rng)
  return state, shardings


def state_shardings(abstract_boxed: State, tx, mesh, rules) -> State:
  """Shardings of the state from the boxed abstract state."""
  params = sharding_lib.logical_shardings(abstract_boxed["params"], mesh,
                                          rules)
  unboxed = {**abstract_boxed, "params": nn.meta.unbox(
      abstract_boxed["params"])}
  return sharding_lib.state_shardings(tx, unboxed, params, mesh)


def _microbatches(batch: dict, count: int) -> dict:
  def split(x):
    if x.shape[0] % count:
      raise ValueError(f"Batch of {x.shape[0]} rows cannot be split into "
                       f"{count} accumulation steps; make "
                       "config.batch_size divisible by "
                       "config.accumulation_steps.")
    return x.reshape((count, x.shape[0] // count) + x.shape[1:])
  return jax.tree.map(split, batch)


class PretrainingObjective:
  """MLM (+ SOP/NSP) in sum form; see `objectives`.

  An objective tells the train step three things: the sums one (micro-)batch
  contributes (`sums`, including one "<term>_loss_sum" per loss term), each
  term's whole-batch denominator (`denominators`), and the metrics shown from
  accumulated sums (`metrics`). The loss is Σ_term loss_sum / denominator.
  """

  def __init__(self, model: nn.Module):
    self.model = model

  def sums(self, params, batch: dict, rng, deterministic: bool) -> dict:
    cfg = self.model.config
    position_ids = None
    if cfg.position_ids_from_padding:
      # RoBERTa's positions, from the attention mask rather than the ids: a
      # masked token replaced by a random <pad> must not shift the rest.
      real = (batch["attention_mask"] != 0).astype(jnp.int32)
      position_ids = jnp.cumsum(real, axis=1) * real + cfg.pad_token_id
    out = self.model.apply(
        {"params": params}, batch["input_ids"], batch["token_type_ids"],
        batch["attention_mask"], position_ids=position_ids,
        masked_positions=batch["masked_positions"],
        deterministic=deterministic,
        rngs=None if deterministic else {"dropout": rng})
    return objectives.pretraining_sums(out, batch)

  def denominators(self, batch: dict) -> dict[str, jax.Array]:
    dens = {"mlm": jnp.sum(batch["masked_weights"].astype(jnp.float32))
                   + objectives.MLM_EPS}
    # The loader always yields sentence labels (-1 without a sentence
    # objective); only a model with the sentence head has a term for them.
    if "sentence_labels" in batch and "sop" in self.model.heads:
      dens["sop"] = jnp.maximum(jnp.sum(
          (batch["sentence_labels"] >= 0).astype(jnp.float32)), 1.0)
    return dens

  def metrics(self, sums: dict) -> dict[str, jax.Array]:
    return objectives.metrics_from_sums(sums)


def _as_objective(model_or_objective):
  if isinstance(model_or_objective, nn.Module):
    return PretrainingObjective(model_or_objective)
  return model_or_objective


def nonfinite_leaves(grads: Any) -> jax.Array:
  """[num_leaves] bool: which gradient leaves hold a NaN or Inf (tree order)."""
  return jnp.stack([~jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)])


def leaf_paths(tree: Any) -> list[str]:
  """Slash-joined paths of a pytree's leaves, in `nonfinite_leaves` order."""
  return ["/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
          for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _updates_applied(opt_state, default: jax.Array) -> jax.Array:
  """The learning-rate schedule's own count: steps whose update was applied.

  Skipped (non-finite) steps keep the old optimizer state, so this lags the
  step counter by the number of skips; the schedule follows it.
  """
  is_sched = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
  counts = [s.count for s in jax.tree.leaves(opt_state, is_leaf=is_sched)
            if is_sched(s)]
  return counts[0] if counts else default


def make_train_step(objective, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, accumulation_steps: int = 1
                    ) -> Callable[[State, dict], tuple[State, dict]]:
  """(state, batch) → (state, metrics).

  Args:
    objective: a `PretrainingObjective`-like object, or a pre-training
      `Albert` module (wrapped in one). Batch arrays are [B, ...].
    tx, schedule: from `optim.make`.
    accumulation_steps: micro-batches per step (B must divide by it).

  A step whose loss or gradients are not finite changes neither parameters
  nor optimizer state (so the learning-rate schedule does not advance
  either); the step counter still does, so the data moves on.
  metrics["skipped"] is 1 for it and metrics["nonfinite_grads"] flags the
  offending gradient leaves (order of `leaf_paths(params)`).
  """
  if accumulation_steps < 1:
    raise ValueError(f"config.accumulation_steps must be >= 1, got "
                     f"{accumulation_steps}.")
  objective = _as_objective(objective)

  def step(state: State, batch: dict) -> tuple[State, dict]:
    params = state["params"]
    rng = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]),
                             state["step"])
    # Whole-batch denominators, so that each micro-batch's gradient is its
    # share of the full batch's and the accumulated sum is the full gradient.
    dens = objective.denominators(batch)

    def loss_fn(p, micro, micro_rng):
      sums = objective.sums(p, micro, micro_rng, deterministic=False)
      loss = sum(sums[f"{term}_loss_sum"] / den for term, den in dens.items())
      return loss, sums

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if accumulation_steps == 1:
      (loss, sums), grads = grad_fn(params, batch, rng)
    else:
      micro = _microbatches(batch, accumulation_steps)

      def body(carry, inputs):
        index, mb = inputs
        (l, s), g = grad_fn(params, mb, jax.random.fold_in(rng, index))
        acc_g, acc_s, acc_l = carry
        return (jax.tree.map(lambda a, b: a + b.astype(a.dtype), acc_g, g),
                jax.tree.map(jnp.add, acc_s, s), acc_l + l), None

      # Sum in float32 even for low-precision parameters, so that many
      # micro-batches do not round away each other's contributions.
      zeros_g = jax.tree.map(
          lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype,
                                                         jnp.float32)),
          params)
      zeros_s = jax.tree.map(
          lambda x: jnp.zeros(x.shape, x.dtype),
          jax.eval_shape(lambda: objective.sums(
              params, jax.tree.map(lambda x: x[0], micro), rng, False)))
      (grads, sums, loss), _ = jax.lax.scan(
          body, (zeros_g, zeros_s, jnp.zeros([], jnp.float32)),
          (jnp.arange(accumulation_steps), micro))
      # Back to the parameters' dtype, as a single step's gradients are.
      grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)

    # The barrier keeps XLA from copying the whole finiteness check into each
    # parameter's and optimizer slot's update (it halves the step's HLO).
    bad_leaves = jax.lax.optimization_barrier(nonfinite_leaves(grads))
    ok = jnp.isfinite(loss) & ~jnp.any(bad_leaves)
    updates, opt_state = tx.update(grads, state["opt_state"], params)
    new_params = optax.apply_updates(params, updates)
    # A non-finite step keeps the old parameters and optimizer state.
    keep = lambda new, old: jax.tree.map(
        lambda n, o: jnp.where(ok, n, o), new, old)
    new_params = keep(new_params, params)
    opt_state = keep(opt_state, state["opt_state"])
    metrics = objective.metrics(sums)
    metrics["grad_norm"] = optax.tree.norm(grads)
    metrics["param_norm"] = optax.tree.norm(new_params)
    metrics["learning_rate"] = schedule(
        _updates_applied(state["opt_state"], state["step"]))
    metrics["skipped"] = 1.0 - ok.astype(jnp.float32)
    metrics["nonfinite_grads"] = bad_leaves
    new_state = {**state, "step": state["step"] + 1, "params": new_params,
                 "opt_state": opt_state}
    return new_state, metrics

  return step


def make_eval_step(objective) -> Callable[[Any, dict], dict]:
  """(params, batch) → sums (add them up over batches, then
  `objective.metrics`). `objective` as in `make_train_step`."""
  objective = _as_objective(objective)
  def step(params, batch):
    return objective.sums(params, batch, None, deterministic=True)
  return step


def jit_train_step(step_fn, state_shardings_: State, mesh, rules,
                   compiler_options: dict[str, Any] | None = None):
  """jit with explicit shardings; the old state's buffers are donated.

  `compiler_options` go to `jax.jit`, as in `create_state`.
  """
  data = sharding_lib.data_sharding(mesh)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  jitted = jax.jit(step_fn, in_shardings=(state_shardings_, data),
                   out_shardings=(state_shardings_, replicated),
                   donate_argnums=(0,), compiler_options=compiler_options)

  @functools.wraps(step_fn)
  def run(state, batch):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return jitted(state, batch)
  run.jitted = jitted
  return run

