"""layers: Dense's CPU matmul, the GELUs' and LayerNorm's custom derivatives.

They change how the backward pass is computed, never what: Dense's outputs
and gradients equal the plain einsum's, the GELUs' values are jax.nn.gelu's
bit for bit and their derivatives autodiff's, LayerNorm's values are its
formula's and its gradients autodiff's, a tiny model's loss and gradients
are unchanged, and the backward pass keeps fewer arrays.
"""

import contextlib
import io
import sys

import flax.linen as nn
import jax
import jax.ad_checkpoint
import jax.numpy as jnp
from locations import EXPERIMENTS
import numpy as np
import pytest

from albert_jax import config_lib
from albert_jax import tree as tree_lib
from albert_jax.model import albert as albert_lib
from albert_jax.model import layers
from albert_jax.model.config import ModelConfig
from albert_jax.training import objectives
from albert_jax.training.run_setup import FAST_COMPILE_OPTIONS

sys.path.insert(0, str(EXPERIMENTS / "benchmarks"))
# The benchmarks' before/after switches: each puts a library change back to
# what autodiff of the plain formula does.
import step_fixes  # noqa: E402  pylint: disable=g-import-not-at-top

TPU = jax.sharding.AbstractDevice("TPU v5 lite", None, "tpu")


def einsum_dense(params, x, contract, dtype):
  """The reference: Dense as an einsum over the trailing `contract` axes."""
  kernel, bias = params["params"]["kernel"], params["params"]["bias"]
  ins, outs = "abcd"[:contract], "wxyz"[:kernel.ndim - contract]
  y = jnp.einsum(f"...{ins},{ins}{outs}->...{outs}", x.astype(dtype),
                 kernel.astype(dtype))
  return y + bias.astype(dtype)


def dense_case(contract, dtype, seed=0):
  """(module, params, x): a Dense with a 2-D output or a 2-axis input."""
  rng = np.random.default_rng(seed)
  if contract == 1:
    module = layers.Dense((3, 5), ("embed", "heads", "kv"), dtype=dtype)
    x = rng.normal(size=(2, 7, 6))
  else:
    module = layers.Dense((6,), ("heads", "kv", "embed"), contract=2,
                          dtype=dtype)
    x = rng.normal(size=(2, 7, 3, 5))
  x = jnp.asarray(x, jnp.float32)
  params = module.init(jax.random.key(seed), x)
  params = jax.tree.map(
      lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32),
      nn.meta.unbox(params))
  return module, params, x


@pytest.mark.parametrize("contract, dtype, rtol", [
    (1, jnp.float32, 1e-6), (2, jnp.float32, 1e-6),
    (1, jnp.bfloat16, 2e-2), (2, jnp.bfloat16, 2e-2),
    (2, jnp.float16, 2e-3)])
def test_dense_matches_the_einsum_in_value_and_gradients(contract, dtype,
                                                         rtol):
  module, params, x = dense_case(contract, dtype)
  assert layers.compile_platform() == "cpu"  # the custom matmul is in use

  def run(apply):
    def loss(p, x):
      return jnp.sum(jnp.sin(apply(p, x).astype(jnp.float32)))
    fn = lambda p, x: (apply(p, x), jax.value_and_grad(  # noqa: E731
        loss, argnums=(0, 1))(p, x))
    return jax.jit(fn, compiler_options=FAST_COMPILE_OPTIONS)(params, x)

  y, (value, grads) = run(module.apply)
  y_ref, (value_ref, grads_ref) = run(
      lambda p, x: einsum_dense(p, x, contract, dtype))
  assert y.dtype == y_ref.dtype == dtype and y.shape == y_ref.shape
  np.testing.assert_allclose(np.float32(y), np.float32(y_ref), rtol=rtol,
                             atol=rtol)
  np.testing.assert_allclose(value, value_ref, rtol=rtol)
  for name in ("kernel", "bias"):
    got, want = grads[0]["params"][name], grads_ref[0]["params"][name]
    assert got.dtype == want.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
  np.testing.assert_allclose(grads[1], grads_ref[1], rtol=rtol, atol=rtol)


def test_dense_keeps_its_parameters_and_logical_axes():
  module, _, x = dense_case(2, jnp.float32)
  boxed = jax.eval_shape(module.init, jax.random.key(0), x)["params"]
  assert boxed["kernel"].names == ("heads", "kv", "embed")
  assert boxed["kernel"].value.shape == (3, 5, 6)
  assert boxed["bias"].names == ("embed",)
  with jax.sharding.use_abstract_mesh(
      jax.sharding.AbstractMesh((1,), ("data",), abstract_device=TPU)):
    plain = jax.eval_shape(module.init, jax.random.key(0), x)["params"]
  assert jax.tree.structure(plain) == jax.tree.structure(boxed)


def grad_jaxpr(module, params, x) -> str:
  return str(jax.make_jaxpr(jax.grad(
      lambda p: jnp.sum(module.apply(p, x))))(params))


def test_the_weight_gradient_is_a_transposed_matmul_on_cpu_only():
  """The barrier marks the fast path; a TPU mesh gets the plain einsum."""
  module, params, x = dense_case(1, jnp.float32)
  assert "optimization_barrier" in grad_jaxpr(module, params, x)
  mesh = jax.sharding.AbstractMesh((1,), ("data",), abstract_device=TPU)
  with jax.sharding.use_abstract_mesh(mesh):
    assert layers.compile_platform() == "tpu"
    assert "optimization_barrier" not in grad_jaxpr(module, params, x)
  with jax.set_mesh(jax.make_mesh((1,), ("data",))):
    assert layers.compile_platform() == "cpu"


def dot_precisions(fn, *args) -> list[str]:
  text = str(jax.make_jaxpr(fn)(*args))
  return [part.split("\n")[0].strip() for part in text.split("precision=")[1:]]


def test_the_backward_dots_keep_the_forward_precision():
  """As autodiff of the einsum does: the precision in force at the forward
  pass, even if the backward pass is traced outside that scope."""
  module, params, x = dense_case(1, jnp.float32)
  mesh = jax.sharding.AbstractMesh((1,), ("data",), abstract_device=TPU)
  found = {}
  for name, scope in (("cpu", contextlib.nullcontext),
                      ("einsum", lambda: jax.sharding.use_abstract_mesh(mesh))):
    with scope():
      with jax.default_matmul_precision("bfloat16"):
        _, vjp = jax.vjp(lambda p: module.apply(p, x), params)
      found[name] = dot_precisions(vjp, jnp.ones((2, 7, 3, 5)))
  assert len(found["cpu"]) == 2  # dx and dW
  assert set(found["cpu"]) == set(found["einsum"])
  assert all("DEFAULT" in p for p in found["cpu"]), found


X = np.concatenate([np.linspace(-12.0, 12.0, 2401),
                    [-1e30, -1e20, -3e4, -300.0, 300.0, 3e4, 1e20, 1e30]])


def exact_slope(x, approximate):
  """gelu'(x) in float64."""
  x = np.asarray(x, np.float64)
  if approximate:
    c = np.sqrt(2 / np.pi)
    with np.errstate(over="ignore", invalid="ignore"):
      th = np.tanh(c * (x + 0.044715 * x ** 3))
      poly = np.where(np.abs(x) < 20, 1 + 3 * 0.044715 * x * x, 0.0)
    return 0.5 * (1 + th) + 0.5 * np.where(np.abs(x) < 20, x, 0.0) * (
        1 - th) * (1 + th) * c * poly
  from scipy.special import ndtr  # pylint: disable=g-import-not-at-top
  with np.errstate(over="ignore", under="ignore"):
    return ndtr(x) + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)


@pytest.mark.parametrize("name, approximate", [("gelu_new", True),
                                               ("gelu", False)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_gelu_values_are_jax_nn_gelu_bit_for_bit(name, approximate, dtype):
  x = jnp.asarray(X[np.abs(X) < 6e4], dtype)
  got = jax.jit(layers.activation(name))(x)
  want = jax.jit(lambda v: jax.nn.gelu(v, approximate=approximate))(x)
  assert got.dtype == dtype
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("name, approximate", [("gelu_new", True),
                                               ("gelu", False)])
def test_gelu_derivative_is_exact_and_finite_everywhere(name, approximate,
                                                       production_compile):
  fn = layers.activation(name)
  x = jnp.asarray(X, jnp.float32)
  slope = np.asarray(jax.jit(jax.vmap(jax.grad(fn)),
                             compiler_options=production_compile)(x))
  assert np.all(np.isfinite(slope))
  # Where autodiff of the plain formula is finite, it agrees; the tanh
  # form's autodiff is NaN past |x| ~ 1e13 (0 · inf), this one is not.
  autodiff = np.asarray(jax.jit(jax.vmap(jax.grad(
      lambda v: jax.nn.gelu(v, approximate=approximate))),
                                 compiler_options=production_compile)(x))
  finite = np.isfinite(autodiff)
  assert finite[np.abs(X) <= 3e4].all()
  # Autodiff loses up to ~3.5e-6 in float32 where 1 ± tanh cancels (x near
  # -5, where it gives 0 for a slope of -1e-6); the tanh form's rule, from
  # logistic functions, does not (against float64 below).
  np.testing.assert_allclose(slope[finite], autodiff[finite], rtol=1e-6,
                             atol=4e-6)
  error = np.abs(slope - exact_slope(X.astype(np.float32), approximate))
  assert error.max() <= (3e-7 if approximate else 4e-6)
  autodiff_error = np.abs(autodiff - exact_slope(X.astype(np.float32),
                                                 approximate))[finite]
  assert error.max() <= autodiff_error.max() + np.finfo(np.float32).eps


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gelu_derivative_keeps_low_precision_dtypes(dtype):
  x = jnp.asarray(X[np.abs(X) < 6e4], dtype)
  for name, approximate in (("gelu_new", True), ("gelu", False)):
    slope = jax.jit(jax.vmap(jax.grad(layers.activation(name))))(x)
    assert slope.dtype == dtype
    slope = np.asarray(slope, np.float32)
    assert np.all(np.isfinite(slope))
    exact = exact_slope(np.asarray(x, np.float32), approximate)
    # One bfloat16 rounding of the last product; float16 is finer.
    np.testing.assert_allclose(slope, exact, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("approximate", [True, False])
def test_gelu_second_derivative_matches_autodiff(approximate,
                                                production_compile):
  """The model needs only first derivatives; a custom JVP still gives
  correct higher ones (e.g. for a gradient penalty)."""
  fn = layers.gelu_tanh if approximate else layers.gelu_erf
  x = jnp.linspace(-8.0, 8.0, 801)
  second = jax.jit(jax.vmap(jax.grad(jax.grad(fn))),
                   compiler_options=production_compile)(x)
  ref = jax.jit(jax.vmap(jax.grad(jax.grad(
      lambda v: jax.nn.gelu(v, approximate=approximate)))),
                compiler_options=production_compile)(x)
  # Against float64 (a central difference of the exact slope): within
  # float32's rounding, and no further than autodiff's, which loses its
  # last digits where 1 ± tanh cancels.
  xs = np.asarray(x, np.float64)
  exact = (exact_slope(xs + 1e-6, approximate)
           - exact_slope(xs - 1e-6, approximate)) / 2e-6
  error = np.abs(np.asarray(second, np.float64) - exact)
  assert error.max() <= 2e-6
  assert error.max() <= np.abs(np.asarray(ref, np.float64) - exact).max()
  np.testing.assert_allclose(second, ref, rtol=1e-5,
                             atol=3e-5 if approximate else 1e-6)


################################################################################
# A tiny model with and without the two changes.
################################################################################

SEQ, BATCH, PREDICTIONS, FFN = 8, 2, 3, 40


def tiny(hidden_act="gelu_new", **overrides):
  return ModelConfig.from_dict(config_lib.tiny_model(
      hidden_act=hidden_act, intermediate_size=FFN, num_hidden_layers=3,
      **overrides))


def tiny_batch(cfg):
  rng = np.random.default_rng(0)
  ids = rng.integers(5, cfg.vocab_size, (BATCH, SEQ), dtype=np.int32)
  positions = np.sort(np.stack([rng.choice(np.arange(1, SEQ), PREDICTIONS,
                                           replace=False)
                                for _ in range(BATCH)]), 1).astype(np.int32)
  return {
      "input_ids": ids, "token_type_ids": np.zeros_like(ids),
      "attention_mask": np.ones_like(ids), "masked_positions": positions,
      "masked_ids": ids[np.arange(BATCH)[:, None], positions],
      "masked_weights": np.ones((BATCH, PREDICTIONS), np.float32),
      "sentence_labels": np.array([0, 1], np.int32)}


def init_params(cfg):
  """rng → the model's unboxed parameters."""
  def init(rng):
    return nn.meta.unbox(albert_lib.Albert(cfg).init(
        rng, jnp.zeros((1, SEQ), jnp.int32),
        masked_positions=jnp.zeros((1, PREDICTIONS), jnp.int32))["params"])
  return init


def loss_fn(cfg):
  """params → the pre-training loss, as the train step computes it."""
  objective = objectives.MaskedLMObjective(albert_lib.Albert(cfg))
  batch = jax.tree.map(jnp.asarray, tiny_batch(cfg))
  dens = objective.denominators(batch)

  def loss(params):
    sums = objective.sums(params, batch, None, deterministic=True)
    return sum(sums[f"{t}_loss_sum"] / d for t, d in dens.items())
  return loss


ALL_CHANGES = "-dense_vjp-gelu_jvp-layer_norm_vjp-ffn_act_remat-attn_rows"


@contextlib.contextmanager
def without_the_changes(spec: str = ALL_CHANGES):
  """The library with the changes `spec` names switched off (by default
  all: Dense as a plain einsum, the GELUs as jax.nn.gelu, LayerNorm as its
  formula, the FFN keeping its activation's output, attention as
  scores/softmax/context differentiated by autodiff)."""
  with contextlib.ExitStack() as stack:
    for _, patch in step_fixes.changes(spec):
      stack.enter_context(patch())
    yield


def loss_and_grads_fn(cfg):
  """A function of no arguments: the pre-training loss and its gradients
  at `init_params(cfg)`, traced (and so formulated) when it is called."""
  params = jax.jit(init_params(cfg), compiler_options=FAST_COMPILE_OPTIONS)(
      jax.random.key(0))
  return lambda: jax.jit(jax.value_and_grad(loss_fn(cfg)),
                         compiler_options=FAST_COMPILE_OPTIONS)(params)


def test_tiny_model_loss_and_gradients_are_unchanged():
  run = loss_and_grads_fn(tiny())
  loss, grads = run()
  with without_the_changes():
    loss_ref, grads_ref = run()
  np.testing.assert_allclose(loss, loss_ref, rtol=1e-6)
  # Gradients that are zero in exact arithmetic (the key bias's: softmax
  # ignores a constant added to a row) are rounding noise; compare them on
  # the scale of the largest gradient.
  scale = max(float(jnp.max(jnp.abs(r))) for r in jax.tree.leaves(grads_ref))
  for path, g, r in zip(tree_lib.flatten(grads), jax.tree.leaves(grads),
                        jax.tree.leaves(grads_ref)):
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6 * scale,
                               err_msg=path)


def saved_residual_shapes(cfg) -> list[str]:
  """The shapes ("f32[3,2,8,40]") of what the backward pass keeps."""
  params = jax.eval_shape(init_params(cfg), jax.random.key(0))
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    jax.ad_checkpoint.print_saved_residuals(loss_fn(cfg), params)
  # Lines read "f32[3,2,8,40] output of scan from ...".
  shapes = [line.split(" ")[0] for line in out.getvalue().splitlines()]
  return [s for s in shapes if "[" in s]


def stacked_residuals(cfg, width) -> int:
  """How many [layers, B, T, width]-sized arrays the backward pass keeps."""
  wanted = f"[{cfg.num_steps},{BATCH},{SEQ},{width}]"
  return sum(s[s.index("["):] == wanted for s in saved_residual_shapes(cfg))


def stacked_attention_residuals(cfg) -> list[str]:
  """The [layers, B, heads, T, T]-shaped arrays the backward pass keeps."""
  wanted = f"[{cfg.num_steps},{BATCH},{cfg.num_attention_heads},{SEQ},{SEQ}]"
  return [s for s in saved_residual_shapes(cfg) if s.endswith(wanted)]


@pytest.mark.parametrize("hidden_act, before", [("gelu_new", 6),
                                                ("gelu", 4)])
def test_the_ffn_keeps_one_stacked_residual(hidden_act, before):
  """The activation's input only: its output is recomputed (one elementwise
  op) rather than kept for the output matmul's weight gradient. Without
  that it keeps two (the input and gelu'(x)), and with autodiff's GELU
  `before` (x³, tanh and their products; or erfc and exp)."""
  cfg = tiny(hidden_act)
  assert stacked_residuals(cfg, FFN) == 1
  with without_the_changes("-ffn_act_remat"):
    assert stacked_residuals(cfg, FFN) == 2
  with without_the_changes():
    assert stacked_residuals(cfg, FFN) == before


def test_attention_keeps_one_stacked_probability_array():
  """The probabilities, where autodiff of scale, softmax and the zeroing of
  padding rows keeps two (exp(x - max) and the probabilities)."""
  cfg = tiny()
  assert stacked_attention_residuals(cfg) == [
      f"f32[3,{BATCH},{cfg.num_attention_heads},{SEQ},{SEQ}]"]
  with without_the_changes("-attn_rows"):
    assert len(stacked_attention_residuals(cfg)) == 2


def test_layer_norms_keep_one_stacked_residual_each():
  """Per layer: the block's input, each LayerNorm's normalised input, and
  the first one's output (the FFN's input); autodiff of LayerNorm keeps two
  more arrays each (x - mean and 2·(x - mean)), and Dense's flattened
  inputs would be three copies of one for Q, K and V."""
  cfg = tiny()
  assert stacked_residuals(cfg, cfg.hidden_size) == 4
  with without_the_changes():
    assert stacked_residuals(cfg, cfg.hidden_size) == 8


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_layer_norm_matches_its_formula_in_value_and_gradients(dtype):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(3, 5, 16)) * 3 + 1, dtype)
  module = layers.LayerNorm(dtype=dtype)
  params = {"params": {"scale": jnp.asarray(rng.normal(size=16), jnp.float32),
                       "bias": jnp.asarray(rng.normal(size=16), jnp.float32)}}

  def formula(p, x):
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + 1e-12)
    return (y * p["params"]["scale"] + p["params"]["bias"]).astype(dtype)

  def run(apply):
    def loss(p, x):
      return jnp.sum(jnp.sin(apply(p, x).astype(jnp.float32)))
    fn = lambda p, x: (apply(p, x), jax.grad(loss, argnums=(0, 1))(p, x))  # noqa
    return jax.jit(fn)(params, x)

  (y, grads), (y_ref, grads_ref) = run(module.apply), run(formula)
  assert y.dtype == dtype
  np.testing.assert_array_equal(np.float32(y), np.float32(y_ref))
  assert grads[1].dtype == dtype
  rtol = 1e-5 if dtype == jnp.float32 else 1e-2
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
    np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=rtol,
                               atol=rtol)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gpu_layer_norm_matches_the_formula_and_keeps_its_input(dtype):
  """`_layer_norm_gpu`: the same values and gradients as the formula, the
  input's gradient in the input's dtype, and x itself (not a float32
  normalised copy) kept for the backward pass."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(3, 5, 16)) * 3 + 1, dtype)
  scale = jnp.asarray(rng.normal(size=16), jnp.float32)
  bias = jnp.asarray(rng.normal(size=16), jnp.float32)

  def formula(x, scale, bias):
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + 1e-12) * scale + bias
    return y.astype(dtype)

  rule = lambda x, s, b: layers._layer_norm_gpu(x, s, b, 1e-12, dtype)  # noqa
  def run(fn):
    loss = lambda *a: jnp.sum(jnp.sin(fn(*a).astype(jnp.float32)))  # noqa
    return jax.jit(lambda *a: (fn(*a), jax.grad(loss, argnums=(0, 1, 2))(
        *a)))(x, scale, bias)

  (y, grads), (y_ref, grads_ref) = run(rule), run(formula)
  np.testing.assert_array_equal(np.float32(y), np.float32(y_ref))
  assert [g.dtype for g in grads] == [dtype, jnp.float32, jnp.float32]
  rtol = 1e-5 if dtype == jnp.float32 else 1e-2
  for got, want in zip(grads, grads_ref):
    np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=rtol,
                               atol=rtol)
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    jax.ad_checkpoint.print_saved_residuals(
        lambda x: jnp.sum(rule(x, scale, bias).astype(jnp.float32)), x)
  kept = [line.split(" ")[0] for line in out.getvalue().splitlines()]
  wide = [k for k in kept if k.endswith("[3,5,16]")]
  assert wide == [f"{'bf16' if dtype == jnp.bfloat16 else 'f32'}[3,5,16]"]
  assert "f32[3,5,1]" in kept


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_formulations_give_the_same_loss_and_gradients(dtype,
                                                           monkeypatch):
  """Traced for a GPU, the model takes its GPU formulations (LayerNorm
  keeping its input, the FFN's first bias added at the activation, the
  layers unrolled); run here on CPU, they compute what the CPU's do."""
  cfg = tiny(dtype=dtype, attention_impl="xla")
  run = loss_and_grads_fn(cfg)
  loss, grads = run()
  monkeypatch.setattr(layers, "compile_platform", lambda: "gpu")
  params = jax.eval_shape(init_params(cfg), jax.random.key(0))
  text = str(jax.make_jaxpr(jax.grad(loss_fn(cfg)))(params))
  assert "optimization_barrier" in text  # the GPU LayerNorm's residuals
  loss_gpu, grads_gpu = run()
  tol = 1e-5 if dtype == "float32" else 5e-2
  np.testing.assert_allclose(loss_gpu, loss, rtol=tol)
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads))
  for got, want in zip(jax.tree.leaves(grads_gpu), jax.tree.leaves(grads)):
    np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=tol,
                               atol=tol * scale)


@pytest.mark.parametrize("kind", layers.INITIALIZERS)
def test_kernel_init_draws_the_named_distribution(kind):
  """The official truncated normal (redrawn beyond 2σ: deviation 0.88σ)
  and transformers' untruncated normal (deviation σ, 4.6% beyond 2σ)."""
  w = np.asarray(layers.kernel_init(0.02, kind)(jax.random.key(0),
                                                (400, 500)))
  beyond = np.mean(np.abs(w) > 0.04)
  if kind == "truncated_normal":
    assert beyond == 0.0
    np.testing.assert_allclose(w.std(), 0.02 * 0.8796, rtol=0.01)
  else:
    np.testing.assert_allclose(beyond, 0.0455, atol=0.002)
    np.testing.assert_allclose(w.std(), 0.02, rtol=0.01)


def test_model_initializer_reaches_every_matrix_and_table():
  """model.initializer="normal" starts every kernel and embedding table
  untruncated (values beyond 2σ), "truncated_normal" none."""
  for kind in layers.INITIALIZERS:
    cfg = ModelConfig.from_dict({
        **config_lib.tiny_model().to_dict(), "initializer": kind})
    params = nn.meta.unbox(jax.jit(albert_lib.Albert(cfg).init)(
        jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])
    weights = {path: np.asarray(w)
               for path, w in tree_lib.flatten(params).items()
               if path.endswith(("kernel", "embedding"))}
    assert len(weights) == 13, sorted(weights)
    for path, w in weights.items():
      beyond = bool(np.any(np.abs(w) > 2 * 0.02))
      # An untruncated draw of n values has none beyond 2σ with
      # probability 0.9545^n: 0.05 for the 64 token-type values, 1e-20
      # for 1000; the smaller tensors are only checked the other way.
      if kind == "truncated_normal":
        assert not beyond, path
      elif w.size >= 1000:
        assert beyond, path


def test_an_unknown_initializer_is_refused():
  with pytest.raises(ValueError, match="model.initializer='xavier'"):
    ModelConfig(initializer="xavier")
  with pytest.raises(ValueError, match="Unknown initializer 'xavier'"):
    layers.kernel_init(0.02, "xavier")
