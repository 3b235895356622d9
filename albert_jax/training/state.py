"""The train state, created already sharded.

State is a plain dict pytree: {"step", "params", "opt_state", "rng"}. Its
shardings come from the parameters' logical axis names through the config's
rules; `jax.jit(init, out_shardings=...)` materialises it in place, so no
device ever holds a full replica it does not need.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from albert_jax import sharding as sharding_lib

State = dict[str, Any]


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


def create_state(init: Callable[[jax.Array], State],
                      tx: optax.GradientTransformation, mesh, rules,
                      rng: jax.Array,
                      compiler_options: dict[str, Any] | None = None
                      ) -> tuple[State, State]:
  """Initialises the train state directly into its shardings.

  Args:
    init: rng → boxed state (`state_init_fn`).
    compiler_options: passed to `jax.jit` (e.g. a lower XLA optimisation
      level where compile time matters more than speed, as in tests).

  Returns:
    (state, shardings), both with unboxed parameters.
  """
  _, shardings = abstract_state(init, tx, mesh, rules, rng)

  def unboxed_init(r):
    s = init(r)
    return {**s, "params": nn.meta.unbox(s["params"])}

  with sharding_lib.in_mesh(mesh, rules):
    state = jax.jit(unboxed_init, out_shardings=shardings,
                    compiler_options=compiler_options)(rng)
  return state, shardings


def abstract_state(init: Callable[[jax.Array], State],
                   tx: optax.GradientTransformation, mesh, rules,
                   rng: jax.Array) -> tuple[State, State]:
  """The state `init(rng)` would make, traced for shapes only.

  Returns:
    (abstract, shardings): ShapeDtypeStructs of the state with unboxed
    parameters (what a checkpoint restores into), and the NamedShardings
    the state is created or restored into.
  """
  boxed = jax.eval_shape(init, rng)
  abstract = {**boxed, "params": nn.meta.unbox(boxed["params"])}
  return abstract, state_shardings(boxed, tx, mesh, rules)


def state_shardings(abstract_boxed: State, tx, mesh, rules) -> State:
  """Shardings of the state from the boxed abstract state."""
  params = sharding_lib.logical_shardings(abstract_boxed["params"], mesh,
                                          rules)
  unboxed = {**abstract_boxed, "params": nn.meta.unbox(
      abstract_boxed["params"])}
  return sharding_lib.state_shardings(tx, unboxed, params, mesh)
