"""Depth must not unroll into the graph: compiling 48 layers costs what 12 do.

Each measurement traces, lowers and compiles a fresh `value_and_grad` of a
scalar loss over the whole forward (a new function object every time, so no
cache is hit). It counts the process's CPU seconds rather than wall time, so
other processes on a loaded CI box do not skew it, and keeps the fastest of a
few interleaved repeats after a warm-up.
"""

import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from albert_jax.model.albert import Albert
from albert_jax.model.config import ModelConfig

SHALLOW, DEEP = 12, 48
MAX_RATIO = 1.5
MAX_ROUNDS = 4


def compile_seconds(share: str, num_layers: int) -> float:
  cfg = ModelConfig(vocab_size=32, embedding_size=8, hidden_size=16,
                    num_hidden_layers=num_layers, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=16,
                    share=share)
  model = Albert(cfg, pooler=False, heads=())  # heads would dilute depth
  ids = jnp.zeros((2, 8), jnp.int32)
  params = jax.eval_shape(
      lambda: nn.unbox(model.init(jax.random.PRNGKey(0), ids)["params"]))

  def loss(params, ids):
    out = model.apply({"params": params}, ids)
    return jnp.mean(out["sequence_output"]**2)

  start = time.process_time()
  jax.jit(jax.value_and_grad(loss)).lower(params, ids).compile()
  return time.process_time() - start


@pytest.fixture(scope="module")
def warm_compiler():
  compile_seconds("all", SHALLOW)  # first-compile overheads land here


@pytest.mark.parametrize("share", ["all", "none"])
def test_compile_time_does_not_grow_with_depth(share, warm_compiler,
                                              no_compilation_cache):
  del warm_compiler, no_compilation_cache
  best = {SHALLOW: float("inf"), DEEP: float("inf")}
  for _ in range(MAX_ROUNDS):
    for depth in best:
      best[depth] = min(best[depth], compile_seconds(share, depth))
    if best[DEEP] <= MAX_RATIO * best[SHALLOW]:
      break
  assert best[DEEP] <= MAX_RATIO * best[SHALLOW], (
      f"share={share!r}: compiling {DEEP} layers took {best[DEEP]:.2f}s of "
      f"CPU, {SHALLOW} layers {best[SHALLOW]:.2f}s; depth is leaking into "
      "the compiled graph (unrolled loop?).")
