"""The train-step and compile-time benchmarks: same job, and they run.

The scripts in experiments/benchmarks/ are not part of the library; these
tests check what their numbers rest on (albert_jax and transformers get the
same batch and compute the same loss, the HF model has the same parameters,
the candidate GELU fix is the same function) and smoke-run each script with
its smallest flags in a subprocess.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from albert_jax import hf
from albert_jax import layers
from albert_jax import models
from albert_jax import train_step as step_lib
from albert_jax.model_config import ModelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "experiments", "benchmarks")
sys.path.insert(0, BENCH)
# pylint: disable=g-import-not-at-top,wrong-import-position
import step_fixes  # noqa: E402
import step_impls  # noqa: E402
import step_profile  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def tiny(share="all", seq=32):
  section = step_impls.model_section("tiny", seq)
  section.share = share
  return ModelConfig.from_dict(section)


def test_batch_masks_the_predicted_positions_and_labels_them():
  cfg = tiny()
  b = step_impls.make_batch(cfg, batch=3, seq=32, predictions=5, seed=1)
  rows = np.arange(3)[:, None]
  pos = b["masked_positions"]
  assert np.all(np.diff(pos, axis=1) > 0)  # distinct, sorted
  assert not np.isin(pos, [0, 16, 31]).any()  # never [CLS] or [SEP]
  assert np.all(b["input_ids"][rows, pos] == step_impls.MASK_ID)
  assert np.all(b["labels"][rows, pos] == b["masked_ids"])
  assert np.sum(b["labels"] != -100) == 3 * 5
  assert np.all(b["masked_ids"] >= step_impls.FIRST_WORD_ID)
  assert np.all(b["token_type_ids"][:, :17] == 0)
  assert np.all(b["token_type_ids"][:, 17:] == 1)


@pytest.mark.parametrize("share", ["all", "none"])
def test_hf_model_has_the_same_parameters(share):
  cfg = tiny(share)
  model = transformers.AlbertForPreTraining(step_impls.hf_albert_config(cfg))
  hf_count = sum(p.numel() for p in model.parameters())
  ids = jnp.zeros((1, 8), jnp.int32)
  params = jax.eval_shape(lambda: models.Albert(cfg).init(
      jax.random.key(0), ids, masked_positions=jnp.zeros((1, 2), jnp.int32)))
  ours = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  assert hf_count == ours


def test_hf_and_albert_jax_compute_the_same_loss_on_the_batch():
  """Same weights, same batch: HF's labels/-100 loss equals ours."""
  cfg = tiny()
  batch = step_impls.make_batch(cfg, batch=2, seq=32, predictions=4)
  torch.manual_seed(0)
  model = transformers.AlbertForPreTraining(
      step_impls.hf_albert_config(cfg)).eval()
  with torch.no_grad():
    hf_loss = float(model(**step_impls.hf_inputs(batch, "cpu")).loss)
  state = {k: v.numpy() for k, v in model.state_dict().items()}
  params, _ = hf.params_from_hf(state, cfg)
  objective = step_lib.PretrainingObjective(models.Albert(cfg))
  jbatch = {k: jnp.asarray(batch[k]) for k in step_lib.BATCH_KEYS}
  sums = jax.jit(lambda p, b: objective.sums(p, b, None, True))(params,
                                                               jbatch)
  dens = objective.denominators(jbatch)
  ours = sum(float(sums[f"{t}_loss_sum"] / d) for t, d in dens.items())
  # The official 1e-5 in the MLM denominator is the only difference.
  np.testing.assert_allclose(ours, hf_loss, rtol=1e-5)


def test_gelu_fix_is_the_same_function_with_the_same_derivative():
  x = np.linspace(-6.0, 6.0, 241, dtype=np.float32)
  ref = lambda v: jax.nn.gelu(v, approximate=True)  # noqa: E731
  np.testing.assert_allclose(step_fixes.gelu_tanh(x), ref(x), rtol=1e-6,
                             atol=1e-6)
  # The float64 derivative; float32 autodiff of jax.nn.gelu itself is off by
  # up to ~3e-6 where 1 - tanh² cancels, and so is the fix.
  u = np.sqrt(2 / np.pi) * (x + 0.044715 * x.astype(np.float64) ** 3)
  exact = 0.5 * (1 + np.tanh(u)) + 0.5 * x * (1 - np.tanh(u) ** 2) * np.sqrt(
      2 / np.pi) * (1 + 3 * 0.044715 * x.astype(np.float64) ** 2)
  fix = jax.vmap(jax.grad(step_fixes.gelu_tanh))(x)
  autodiff = jax.vmap(jax.grad(ref))(x)
  np.testing.assert_allclose(fix, exact, rtol=1e-5, atol=4e-6)
  assert np.max(np.abs(fix - exact)) <= np.max(np.abs(autodiff - exact))


def test_dense_fix_gives_the_same_outputs_and_gradients():
  """The weight-gradient-as-xᵀ·g fix changes how XLA runs it, not what."""
  q = layers.Dense((4, 8), ("embed", "heads", "kv"))
  out = layers.Dense((16,), ("heads", "kv", "embed"), contract=2)
  rng = np.random.default_rng(0)

  def normal(*shape):
    return jnp.asarray(rng.normal(size=shape), jnp.float32)

  x = normal(2, 3, 16)
  pq = {"params": {"kernel": normal(16, 4, 8), "bias": normal(4, 8)}}
  po = {"params": {"kernel": normal(4, 8, 16), "bias": normal(16)}}

  def loss(pq, po, x):
    return jnp.sum(jnp.sin(out.apply(po, q.apply(pq, x))))

  grad = lambda: jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))  # noqa
  expected = grad()(pq, po, x)
  with step_fixes.dense_vjp():  # in force while jit traces
    got = grad()(pq, po, x)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op_name, expected", [
    ("jit(step)/jvp(Albert)/encoder/while/body/closed_call/layers/FFNBlock/"
     "intermediate/...a,aw->...w/dot_general", ("forward", "FFN matmuls")),
    ("jit(step)/transpose(jvp(Albert))/encoder/while/body/closed_call/layers/"
     "AttentionBlock/layer_norm/mul", ("backward", "LayerNorm")),
    ("jit(step)/transpose(jvp(Albert))/encoder/while/body/closed_call/layers/"
     "AttentionBlock/bqhd,bkhd->bhqk/dot_general",
     ("backward", "attention scores, mask, softmax, context")),
    ("jit(step)/jvp(Albert)/encoder/while/body/jit(dynamic_update_index_in_"
     "dim)/dynamic_update_slice", ("forward", "layer scan bookkeeping")),
    ("jit(step)/jvp()/reduce_sum",
     ("forward", "losses (cross-entropy) and the rest")),
    ("jit(step)/mul", ("other",
                       "optimizer, clipping, non-finite guard, metrics")),
    ("", ("other", "XLA-inserted copies (no op metadata)")),
])
def test_profile_classifies_ops_by_their_name_stack(op_name, expected):
  assert step_profile.classify("copy.3", op_name) == expected


def test_hlo_op_names_reads_instruction_metadata():
  text = ("  %ynn_fusion.3 = f32[8]{0} fusion(%p), kind=kCustom, "
          'metadata={op_name="jit(step)/jvp(Albert)/x" stack_frame_id=2}\n'
          "  ROOT %copy.1 = f32[8]{0} copy(%ynn_fusion.3)\n")
  assert step_profile.hlo_op_names(text) == {
      "ynn_fusion.3": "jit(step)/jvp(Albert)/x", "copy.1": ""}


def run_script(name, *flags, tmp_path):
  out = tmp_path / "out.json"
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(
      [sys.executable, os.path.join(BENCH, name), *flags, "--json", str(out)],
      capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
      check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(out, encoding="utf-8") as f:
    return proc.stdout, json.load(f)


def test_train_step_script_prints_every_row_and_a_profile(tmp_path):
  stdout, result = run_script(
      "train_step.py", "--sizes", "tiny", "--seqs", "16", "--batch", "2",
      "--predictions", "2", "--steps", "1", "--warmup", "0",
      "--impls", "jax_adamw,hf_eager", "--threads", "1", "--fast_compile",
      "--profile", str(tmp_path / "trace"), "--profile_steps", "1",
      tmp_path=tmp_path)
  table = [l for l in stdout.splitlines() if l.startswith("| tiny | 16 | 2 |")]
  assert [l.split(" | ")[3] for l in table] == ["albert_jax AdamW",
                                                "HF eager (sdpa)"]
  assert table[1].endswith("| 1.00x | — |")  # HF eager against itself
  assert [r["impl"] for r in result["rows"]] == ["jax_adamw", "hf_eager"]
  for row in result["rows"]:
    assert row["step_seconds"] > 0 and row["sequences_per_second"] > 0
  ours, hf_row = result["rows"]
  # The same job for both; HF's head decodes all 16 positions, not 2.
  assert ours["job_flops_per_step"] == hf_row["job_flops_per_step"]
  assert ours["executed_flops_per_step"] == ours["job_flops_per_step"]
  assert hf_row["executed_flops_per_step"] > hf_row["job_flops_per_step"]
  assert "\nProfile: tiny seq 16 batch 2 albert_jax AdamW." in stdout
  assert "| FFN matmuls |" in stdout
  [profile] = result["profiles"]
  assert profile["components"]["FFN matmuls"]["forward"] > 0
  assert profile["components"]["FFN matmuls"]["backward"] > 0


def test_compile_time_script_prints_every_row(tmp_path):
  stdout, result = run_script(
      "compile_time.py", "--width", "tiny", "--depths", "1,2", "--shares",
      "none", "--seq", "16", "--batch", "2", "--predictions", "2",
      "--fast_compile", "--no_warmup", tmp_path=tmp_path)
  table = [l for l in stdout.splitlines() if l.startswith("| tiny |")]
  assert [tuple(l.split(" | ")[1:3]) for l in table] == [("none", "1"),
                                                          ("none", "2")]
  one, two = result["rows"]
  assert one["vs_fewest"] == 1.0
  assert two["vs_fewest"] == two["step_total_s"] / one["step_total_s"]
  # Unshared layers store one parameter set per layer.
  cfg = tiny("none")
  params = jax.eval_shape(lambda: models.Albert(cfg).init(
      jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))["params"]["encoder"]
  stacks = jax.tree.leaves([params["attention"], params["ffn"]])
  per_layer = sum(int(np.prod(x.shape)) for x in stacks) // cfg.num_steps
  assert two["params"] - one["params"] == per_layer
