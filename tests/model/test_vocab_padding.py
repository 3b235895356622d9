"""A vocabulary the tensor axis does not divide, on 4 fake CPU devices.

`layers.Embed.attend` pads the word table to a multiple of the devices that
split the vocabulary and the heads mask the padded logits; the stored table
keeps its rows (`sharding.logical_shardings` stores it whole along the
vocabulary). The 4-device work runs in a subprocess (this file as a
script): it compares a tiny ALBERT's MLM logits, loss and gradients under a
data=2 × tensor=2 mesh with the same model on one device, for a vocabulary
of 1001 words (padded to 1002), and records the shardings and the error
for a dimension that is not the vocabulary.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
VOCAB = 1001


@pytest.fixture(scope="module")
def worker():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
             XLA_FLAGS="--xla_force_host_platform_device_count=4")
  proc = subprocess.run([sys.executable, __file__], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=600,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_padded_logits_match_one_device(worker):
  assert worker["logits_shape"] == [4, 3, VOCAB + 1]
  assert worker["max_logit_difference"] < 1e-5
  assert worker["padding_column"] == "lowest"
  assert worker["loss_difference"] < 1e-6
  # Per tensor, relative to its largest entry floored at 1e-2: the key
  # bias's gradient is zero in exact arithmetic (softmax ignores it).
  assert worker["grad_difference"] < 1e-5


def test_table_stored_whole_along_the_vocabulary(worker):
  # 1001 rows: not split over `tensor`; 1000 rows: split as before.
  assert worker["table_spec"] == [None, None]
  assert worker["table_spec_1000"] == ["tensor", None]
  assert worker["table_shape"] == [VOCAB, 32]


def test_other_indivisible_axes_are_refused(worker):
  assert worker["heads_error"] == (
      "Parameter encoder/attention/key/bias has 2 entries along its 'heads' "
      "axis, which mesh axes ('tensor',) (4 devices) cannot split evenly; "
      "change config.mesh, or map 'heads' to None in "
      "config.sharding_rules.")


def _worker() -> None:
  sys.path.insert(0, str(ROOT))
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from albert_jax import config_lib  # pylint: disable=g-import-not-at-top
  from albert_jax import sharding  # pylint: disable=g-import-not-at-top
  from albert_jax.model.albert import Albert  # pylint: disable=g-import-not-at-top
  from albert_jax.model.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from albert_jax.training import objectives  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_default_matmul_precision", "highest")

  def model_for(vocab, heads=4):
    cfg = ModelConfig.from_dict(config_lib.tiny_model(
        vocab_size=vocab, num_attention_heads=heads, attention_impl="xla"))
    return Albert(cfg, heads=("mlm",))

  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(0, VOCAB, (4, 16)), jnp.int32)
  slots = jnp.asarray(rng.integers(0, 16, (4, 3)), jnp.int32)
  labels = jnp.asarray(rng.integers(0, VOCAB, (4, 3)), jnp.int32)
  model = model_for(VOCAB)

  def loss(params):
    logits = model.apply({"params": params}, ids,
                         masked_positions=slots)["mlm_logits"]
    sums = objectives.mlm_sums(logits, labels, jnp.ones(labels.shape))
    return sums["mlm_loss_sum"], logits

  boxed = jax.eval_shape(model.init, jax.random.key(0), ids,
                         masked_positions=slots)["params"]
  from albert_jax.training.run_setup import FAST_COMPILE_OPTIONS  # pylint: disable=g-import-not-at-top
  params = nn.meta.unbox(jax.jit(
      lambda r: model.init(r, ids, masked_positions=slots)["params"],
      compiler_options=FAST_COMPILE_OPTIONS)(jax.random.key(0)))
  step = jax.jit(jax.value_and_grad(loss, has_aux=True),
                 compiler_options=FAST_COMPILE_OPTIONS)
  (ref_loss, ref_logits), ref_grads = step(params)

  mesh = sharding.make_mesh([("data", 2), ("tensor", 2)])
  rules = sharding.rules_for(mesh)
  shardings = sharding.logical_shardings(boxed, mesh, rules)
  placed = jax.device_put(params, shardings)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    (tp_loss, logits), grads = step(placed)
  logits = np.asarray(logits)
  table = ["embeddings", "word_embeddings", "embedding"]
  spec = lambda s: [a for a in s.spec] + [None] * (2 - len(s.spec))  # noqa: E731
  out = {
      "logits_shape": list(logits.shape),
      "max_logit_difference": float(np.abs(
          logits[..., :VOCAB] - np.asarray(ref_logits)).max()),
      "padding_column": "lowest" if np.all(
          logits[..., VOCAB:] == np.finfo(logits.dtype).min) else "other",
      "loss_difference": float(abs(tp_loss - ref_loss) / abs(ref_loss)),
      "grad_difference": max(
          float(np.abs(np.asarray(a) - np.asarray(b)).max()
                / max(np.abs(np.asarray(b)).max(), 1e-2))
          for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads))),
      "table_spec": spec(shardings[table[0]][table[1]][table[2]]),
      "table_shape": list(params[table[0]][table[1]][table[2]].shape),
  }
  even = model_for(1000)
  even_boxed = jax.eval_shape(even.init, jax.random.key(0), ids,
                              masked_positions=slots)["params"]
  out["table_spec_1000"] = spec(sharding.logical_shardings(
      even_boxed, mesh, rules)[table[0]][table[1]][table[2]])
  two_heads = model_for(VOCAB, heads=2)
  tensor4 = sharding.make_mesh([("data", 1), ("tensor", 4)])
  try:
    sharding.logical_shardings(
        jax.eval_shape(two_heads.init, jax.random.key(0), ids,
                       masked_positions=slots)["params"],
        tensor4, sharding.rules_for(tensor4))
    out["heads_error"] = None
  except ValueError as e:
    out["heads_error"] = str(e)
  print(json.dumps(out))


if __name__ == "__main__":
  _worker()
