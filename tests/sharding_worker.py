"""Runs the tiny model on several 8-device meshes; test_sharding.py reads it.

The test process has one CPU device (tests/conftest.py imports JAX before any
test can ask for more), so the 8-device work runs here, in a subprocess
started with `--xla_force_host_platform_device_count=8`, and the results are
pickled for the test to assert on:

  python tests/sharding_worker.py OUT.pkl

The helpers at the top (tiny config, model, deterministic batches) are also
imported by the tests and by multihost_worker.py; importing this module sets
no flags and touches no devices.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import Any

from locations import REPO
import numpy as np

NUM_DEVICES = 8
SEQ_LEN = 16
NUM_PREDICTIONS = 4
BATCH_SIZE = 8
NUM_STEPS = 2

# Every dim that a rule may split is divisible by 4: heads 4, mlp 64,
# vocab 128, hidden (embed) 32. Dropout is on, so the sharded dropout masks
# must match the single-device ones too.
MODEL = dict(vocab_size=128, embedding_size=16, hidden_size=32,
             num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=32, hidden_dropout_prob=0.1,
             attention_probs_dropout_prob=0.1)

# name → (mesh axes, number of devices used).
MESHES = {
    "single": ([("data", 1)], 1),
    "data": ([("data", -1)], NUM_DEVICES),
    "fsdp": ([("data", 2), ("fsdp", 4)], NUM_DEVICES),
    "tensor": ([("data", 2), ("tensor", 4)], NUM_DEVICES),
}

# name → mesh axes whose make_mesh result (shape or error) is recorded.
MESH_CASES = {
    "fill_data": [("data", -1)],
    "fill_fsdp": [("data", 2), ("fsdp", -1)],
    "fill_middle": [("data", 2), ("fsdp", -1), ("tensor", 2)],
    "exact": [("data", 2), ("fsdp", 2), ("tensor", 2)],
    "too_many": [("data", 16)],
    "too_few": [("data", 2), ("tensor", 2)],
    "not_divisible": [("data", 3), ("fsdp", -1)],
    "two_free": [("data", -1), ("fsdp", -1)],
}


def config(num_train_steps: int = 10):
  """The tiny model's full config (config_lib defaults, small optimizer)."""
  from albert_jax import config_lib  # pylint: disable=g-import-not-at-top
  c = config_lib.base_config(config_lib.tiny_model(**MODEL),
                             batch_size=BATCH_SIZE,
                             num_train_steps=num_train_steps,
                             warmup_steps=2, learning_rate=1e-2,
                             max_seq_length=SEQ_LEN,
                             max_predictions=NUM_PREDICTIONS)
  return c


def spec_and_optimizer(c):
  """(RunSpec, tx, schedule): the run `c` describes (an ALBERT with the MLM
  and SOP heads) and its optimizer."""
  from albert_jax.training import optimizer as optim  # pylint: disable=g-import-not-at-top
  from albert_jax.training import run_spec  # pylint: disable=g-import-not-at-top
  spec = run_spec.run_spec(c)
  tx, schedule = optim.make(c.optimizer, c.num_train_steps)
  return spec, tx, schedule


def init_fn(spec, tx):
  """rng → a fresh train state with boxed parameters."""
  from albert_jax.training import state as state_lib  # pylint: disable=g-import-not-at-top
  return state_lib.state_init_fn(spec.init_params, tx)


def batch(step: int, batch_size: int = BATCH_SIZE) -> dict[str, np.ndarray]:
  """A deterministic global batch for `step` (numpy, on the host)."""
  rng = np.random.default_rng(1000 + step)
  b, t, p = batch_size, SEQ_LEN, NUM_PREDICTIONS
  vocab = MODEL["vocab_size"]
  lengths = rng.integers(t // 2, t + 1, b)
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
  types = (np.arange(t)[None] >= (lengths[:, None] // 2)).astype(np.int32)
  weights = np.ones((b, p), np.float32)
  weights[0, -1] = 0.0  # one padded prediction slot
  return dict(
      input_ids=(rng.integers(5, vocab, (b, t)) * mask).astype(np.int32),
      token_type_ids=types * mask,
      attention_mask=mask,
      masked_positions=rng.integers(1, t // 2, (b, p)).astype(np.int32),
      masked_ids=rng.integers(5, vocab, (b, p)).astype(np.int32),
      masked_weights=weights,
      sentence_labels=rng.integers(0, 2, b).astype(np.int32))


def spec_of(sharding, ndim: int) -> list[tuple[str, ...]]:
  """A NamedSharding's spec as one tuple of mesh axes per array dim."""
  spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
  out = []
  for entry in spec[:ndim]:
    if entry is None:
      out.append(())
    elif isinstance(entry, str):
      out.append((entry,))
    else:
      out.append(tuple(entry))
  return out


def describe(tree) -> dict[str, dict[str, Any]]:
  """keystr(path) → sharding type, spec, mesh and first local shard shape."""
  import jax  # pylint: disable=g-import-not-at-top
  out = {}
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    s = x.sharding
    named = isinstance(s, jax.sharding.NamedSharding)
    out[jax.tree_util.keystr(path)] = dict(
        named=named,
        spec=spec_of(s, x.ndim) if named else None,
        mesh=dict(s.mesh.shape) if named else None,
        shape=tuple(x.shape),
        shard_shape=tuple(x.addressable_shards[0].data.shape),
        num_devices=len(s.device_set))
  return out


def loss_and_grad_fn(model):
  """params, batch → (loss, grads): the train step's objective, no dropout."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from albert_jax.training import objectives  # pylint: disable=g-import-not-at-top

  def loss_fn(params, b):
    out = model.apply({"params": params}, b["input_ids"], b["token_type_ids"],
                      b["attention_mask"],
                      masked_positions=b["masked_positions"],
                      deterministic=True)
    sums = objectives.mlm_sums(out["mlm_logits"], b["masked_ids"],
                               b["masked_weights"])
    sums.update(objectives.sentence_sums(out["sop_logits"],
                                         b["sentence_labels"]))
    mlm_den = jnp.sum(b["masked_weights"]) + objectives.MLM_EPS
    sop_den = jnp.maximum(jnp.sum(
        (b["sentence_labels"] >= 0).astype(jnp.float32)), 1.0)
    return sums["mlm_loss_sum"] / mlm_den + sums["sop_loss_sum"] / sop_den

  return jax.value_and_grad(loss_fn)


def _mesh_cases() -> dict[str, Any]:
  from albert_jax import sharding  # pylint: disable=g-import-not-at-top
  out = {}
  for name, axes in MESH_CASES.items():
    try:
      out[name] = ("ok", dict(sharding.make_mesh(axes).shape))
    except ValueError as e:
      out[name] = ("error", str(e))
  return out


def _run_mesh(name: str) -> dict[str, Any]:
  """Creates the state on one mesh, takes loss/grads, trains NUM_STEPS."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  from albert_jax import sharding  # pylint: disable=g-import-not-at-top
  from albert_jax.training import state as state_lib  # pylint: disable=g-import-not-at-top
  from albert_jax.training import step as step_lib  # pylint: disable=g-import-not-at-top

  axes, count = MESHES[name]
  c = config()
  spec, tx, schedule = spec_and_optimizer(c)
  model = spec.model
  mesh = sharding.make_mesh(axes, jax.devices()[:count])
  rules = sharding.rules_for(mesh, [tuple(r) for r in c.sharding_rules])
  state, shardings = state_lib.create_state(
      init_fn(spec, tx), tx, mesh, rules, jax.random.key(c.seed))
  result = {"mesh": dict(mesh.shape), "rules": rules,
            "initial": describe(state),
            "shardings_match": jax.tree.all(jax.tree.map(
                lambda x, s: x.sharding == s, state, shardings))}

  data = sharding.data_sharding(mesh)
  placed = [jax.device_put(batch(i), data) for i in range(NUM_STEPS)]
  result["batch"] = describe(placed[0])
  result["data_parallel_size"] = sharding.data_parallel_size(mesh)

  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  grad_fn = jax.jit(loss_and_grad_fn(model),
                    in_shardings=(shardings["params"], data),
                    out_shardings=(replicated, shardings["params"]))
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    loss, grads = grad_fn(state["params"], placed[0])
  result["loss"] = float(loss)
  result["grads"] = jax.tree.map(np.asarray, grads)
  result["grads_sharding"] = describe(grads)

  step = step_lib.jit_train_step(
      step_lib.make_train_step(spec.objective, tx, schedule), shardings,
      mesh, rules)
  initial = jax.tree.map(np.asarray, state["params"])
  losses = []
  for b in placed:
    state, metrics = step(state, b)
    losses.append(float(metrics["loss"]))
  result["losses"] = losses
  result["params"] = jax.tree.map(np.asarray, state["params"])
  result["param_change"] = max(jax.tree.leaves(jax.tree.map(
      lambda a, b: float(np.max(np.abs(a - b))), initial, result["params"])))
  result["final"] = describe(state)
  return result


def main(argv: list[str]) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_default_matmul_precision", "highest")
  if len(jax.devices()) != NUM_DEVICES:
    raise SystemExit(f"expected {NUM_DEVICES} devices, got {jax.devices()}; "
                     "set XLA_FLAGS=--xla_force_host_platform_device_count=8")
  results = {"mesh_cases": _mesh_cases(),
             "meshes": {name: _run_mesh(name) for name in MESHES}}
  with open(argv[1], "wb") as f:
    pickle.dump(results, f)


# XLA:CPU spends seconds compiling each program of even this tiny model with
# its default (MLIR fusion emitters, full LLVM optimisation); these two cut
# the train step's compile from ~8 s of CPU to ~2.5 s. Every run a test
# compares is compiled with the same flags.
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0",
                      "--xla_cpu_use_fusion_emitters=false")


def subprocess_env(num_devices: int) -> dict[str, str]:
  """The environment for a worker with `num_devices` fake CPU devices."""
  env = dict(os.environ)
  ours = ("--xla_force_host_platform_device_count",) + tuple(
      f.split("=")[0] for f in FAST_COMPILE_FLAGS)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if not f.startswith(ours)]
  env["XLA_FLAGS"] = " ".join(
      flags + list(FAST_COMPILE_FLAGS)
      + [f"--xla_force_host_platform_device_count={num_devices}"])
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (str(REPO), env.get("PYTHONPATH")) if p)
  return env


def run_once(name: str, tmp_path_factory, compute) -> Any:
  """`compute(directory)` → picklable result, once per pytest session.

  Under pytest-xdist each worker process would run a module's fixtures
  again; the first worker to get here computes (holding a file lock) and
  the others read its pickle. A failure is stored too, so it is reported
  rather than recomputed.
  """
  import fcntl  # pylint: disable=g-import-not-at-top
  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    base = base.parent  # shared by this session's workers
  directory = base / f"shared_{name}"
  directory.mkdir(exist_ok=True)
  result_file = directory / "result.pkl"
  with open(base / f"shared_{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not result_file.exists():
      try:
        result = ("ok", compute(directory))
      except Exception as e:  # pylint: disable=broad-except
        result = ("error", f"{type(e).__name__}: {e}")
      with open(result_file, "wb") as f:
        pickle.dump(result, f)
    with open(result_file, "rb") as f:
      status, value = pickle.load(f)
  if status != "ok":
    raise RuntimeError(value)
  return value


if __name__ == "__main__":
  os.environ.update(subprocess_env(NUM_DEVICES))
  main(sys.argv)
