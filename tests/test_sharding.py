"""Meshes, logical-axis rules and sharded training on 8 fake CPU devices.

The 8-device work runs once, in a subprocess (tests/sharding_worker.py) with
`--xla_force_host_platform_device_count=8`: conftest.py imports JAX in this
process before any test runs, and forcing 8 devices on the whole suite would
change what every other test runs on. The worker builds a single-device, a
data-parallel, an FSDP and a tensor-parallel mesh, creates the sharded train
state on each, takes loss and gradients of one batch and trains two steps;
the tests below assert on what it records.

Expected shardings are derived here, independently of `albert_jax.sharding`:
each parameter's logical names (read from the boxed abstract state) are
looked up in the rules, mesh axes the mesh lacks are dropped, and the result
must equal the array's actual spec and local shard shape. Optimizer slots
must follow their parameter and counters must be replicated.
"""

import pickle
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
import sharding_worker as worker

from albert_jax import sharding
from albert_jax.data.loader import BATCH_KEYS

DATA_AXES = ("data", "fsdp")
SHARDED_MESHES = ("data", "fsdp", "tensor")
TOLERANCE = 1e-5


def _run_worker(directory):
  out = directory / "sharding.pkl"
  try:
    proc = subprocess.run(
        [sys.executable, worker.__file__, str(out)],
        env=worker.subprocess_env(worker.NUM_DEVICES), capture_output=True,
        text=True, timeout=600)
  except subprocess.TimeoutExpired as e:
    raise RuntimeError(f"sharding_worker.py timed out; stderr:\n"
                       f"{(e.stderr or b'')[-5000:]}") from None
  if proc.returncode != 0:
    raise RuntimeError(f"sharding_worker.py failed ({proc.returncode}); "
                       f"stderr:\n{proc.stderr[-8000:]}")
  with open(out, "rb") as f:
    return pickle.load(f)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  return worker.run_once("sharding", tmp_path_factory, _run_worker)


@pytest.fixture(scope="module")
def logical():
  """keystr(path) → logical names, for the state's parameters; and the
  abstract (unboxed) state, computed in this process."""
  c = worker.config()
  spec, tx, _ = worker.spec_and_optimizer(c)
  boxed = jax.eval_shape(worker.init_fn(spec, tx), jax.random.key(0))
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)  # noqa: E731
  flat = jax.tree_util.tree_flatten_with_path(boxed["params"],
                                              is_leaf=is_box)[0]
  names = {}
  for path, box in flat:
    assert isinstance(box, nn.LogicallyPartitioned), (
        f"parameter {jax.tree_util.keystr(path)} has no logical names")
    names[path] = tuple(box.names)
  abstract = {**boxed, "params": nn.meta.unbox(boxed["params"])}
  rules = {name: target for name, target in c.sharding_rules}
  return names, abstract, rules


def _expected_axes(names, rules, mesh) -> list[tuple[str, ...]]:
  """One tuple of mesh axes per dim: the rule's axes that the mesh has."""
  out = []
  for name in names:
    assert name in rules, f"logical axis {name!r} has no sharding rule"
    target = rules[name]
    if target is None:
      targets = ()
    elif isinstance(target, str):
      targets = (target,)
    else:
      targets = tuple(target)
    out.append(tuple(a for a in targets if a in mesh))
  used = [a for dim in out for a in dim]
  assert len(used) == len(set(used)), f"{names} use a mesh axis twice: {out}"
  return out


def _expected_state(logical_info, mesh) -> dict[str, list[tuple[str, ...]]]:
  """keystr(path) → expected axes, for every leaf of the train state."""
  names, abstract, rules = logical_info
  params = {path: _expected_axes(n, rules, mesh) for path, n in names.items()}
  expected = {}
  slots = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]:
    key = jax.tree_util.keystr(path)
    if path[0].key == "params":
      expected[key] = params[path[1:]]
      continue
    # An optimizer slot ends with its parameter's path (…mu['encoder']…).
    owner = [p for p in params
             if len(p) <= len(path) and path[len(path) - len(p):] == p]
    if path[0].key == "opt_state" and owner:
      owner = max(owner, key=len)
      param_shape = abstract["params"]
      for k in owner:
        param_shape = param_shape[k.key]
      assert leaf.shape == param_shape.shape, key
      expected[key] = params[owner]
      slots += 1
    else:
      expected[key] = [()] * leaf.ndim  # counters, step, rng: replicated
  # LAMB keeps two slots (mu, nu) per parameter.
  assert slots == 2 * len(params), (slots, len(params))
  return expected


def _shard_shape(shape, axes, mesh):
  return tuple(n // int(np.prod([mesh[a] for a in dim])) if dim else n
               for n, dim in zip(shape, axes))


# --- Mesh construction (pure; no devices needed). ---


@pytest.mark.parametrize("axes, want", [
    ([("data", -1)], (("data",), (8,))),
    ([("data", 2), ("fsdp", -1)], (("data", "fsdp"), (2, 4))),
    ([("data", 2), ("fsdp", -1), ("tensor", 2)],
     (("data", "fsdp", "tensor"), (2, 2, 2))),
    ([("data", -1), ("fsdp", 1), ("tensor", 1)],
     (("data", "fsdp", "tensor"), (8, 1, 1))),
    ([("data", 2), ("fsdp", 2), ("tensor", 2)],
     (("data", "fsdp", "tensor"), (2, 2, 2))),
])
def test_mesh_shape_fills_the_free_axis(axes, want):
  assert sharding.mesh_shape(axes, 8) == want


@pytest.mark.parametrize("axes, match", [
    ([("data", 16)], r"16 devices but 8 are available.*config\.mesh"),
    ([("data", 2), ("tensor", 2)], r"4 devices but 8 are available"),
    ([("data", 3), ("fsdp", -1)], r"multiple of 3 devices; there are 8"),
    ([("data", -1), ("fsdp", -1)], r"At most one mesh axis may be -1"),
    ([("data", 0), ("fsdp", -1)], r"positive or -1"),
    ([("data", -2)], r"positive or -1"),
    ([("data", 2), ("data", -1)], r"repeat"),
])
def test_mesh_shape_errors(axes, match):
  with pytest.raises(ValueError, match=match):
    sharding.mesh_shape(axes, 8)


def test_make_mesh_on_8_devices(results):
  cases = results["mesh_cases"]
  assert cases["fill_data"] == ("ok", {"data": 8})
  assert cases["fill_fsdp"] == ("ok", {"data": 2, "fsdp": 4})
  assert cases["fill_middle"] == ("ok", {"data": 2, "fsdp": 2, "tensor": 2})
  assert cases["exact"] == ("ok", {"data": 2, "fsdp": 2, "tensor": 2})
  for name, fragment in [("too_many", "16 devices but 8 are available"),
                         ("too_few", "4 devices but 8 are available"),
                         ("not_divisible", "multiple of 3 devices"),
                         ("two_free", "At most one mesh axis may be -1")]:
    status, message = cases[name]
    assert status == "error" and fragment in message, (name, message)
    assert "config.mesh" in message or name == "two_free", message


# --- Rules. ---


def test_rules_for_drops_missing_axes():
  rules = (("a", ("data", "fsdp")), ("b", "tensor"), ("c", None),
           ("d", ["fsdp", "tensor"]), ("e", ("fsdp", "data")))
  mesh = jax.sharding.AbstractMesh((2, 4), ("data", "tensor"))
  assert sharding.rules_for(mesh, rules) == (
      ("a", "data"), ("b", "tensor"), ("c", None), ("d", "tensor"),
      ("e", "data"))
  mesh = jax.sharding.AbstractMesh((8,), ("data",))
  assert sharding.rules_for(mesh, rules) == (
      ("a", "data"), ("b", None), ("c", None), ("d", None), ("e", "data"))
  mesh = jax.sharding.AbstractMesh((2, 2, 2), ("data", "fsdp", "tensor"))
  assert sharding.rules_for(mesh, rules) == (
      ("a", ("data", "fsdp")), ("b", "tensor"), ("c", None),
      ("d", ("fsdp", "tensor")), ("e", ("fsdp", "data")))


@pytest.mark.parametrize("mesh_name", list(worker.MESHES))
def test_rules_for_the_worker_meshes(results, mesh_name):
  r = results["meshes"][mesh_name]
  mesh_axes = set(r["mesh"])
  for logical_name, target in r["rules"]:
    targets = () if target is None else (
        (target,) if isinstance(target, str) else target)
    assert set(targets) <= mesh_axes, (logical_name, target)
  got = dict(r["rules"])
  if "tensor" in mesh_axes:
    assert got["heads"] == got["mlp"] == got["vocab"] == "tensor"
  else:
    assert got["heads"] is None and got["mlp"] is None
  assert got["embed"] == ("fsdp" if "fsdp" in mesh_axes else None)
  assert got["act_batch"] == (("data", "fsdp") if "fsdp" in mesh_axes
                              else "data")


def test_every_parameter_axis_has_a_rule(logical):
  names, _, rules = logical
  used = {n for axes in names.values() for n in axes}
  assert used, "no logical names found"
  assert used <= set(rules), f"no rule for {sorted(used - set(rules))}"
  for rule in sharding.DEFAULT_RULES:
    assert list(rule) in [list(r) for r in worker.config().sharding_rules]


# --- Shardings of the state on each mesh. ---


@pytest.mark.parametrize("mesh_name", list(worker.MESHES))
@pytest.mark.parametrize("when", ["initial", "final"])
def test_state_shardings_follow_logical_names(results, logical, mesh_name,
                                              when):
  r = results["meshes"][mesh_name]
  mesh = r["mesh"]
  expected = _expected_state(logical, mesh)
  actual = r[when]
  assert set(actual) == set(expected)
  assert r["shardings_match"], "create_state's arrays ≠ its shardings"
  problems = []
  for key, want in sorted(expected.items()):
    got = actual[key]
    assert got["named"], f"{key}: not a NamedSharding"
    assert got["mesh"] == mesh, key
    assert got["num_devices"] == worker.MESHES[mesh_name][1], key
    want_shard = _shard_shape(got["shape"], want, mesh)
    if got["spec"] != want or got["shard_shape"] != want_shard:
      problems.append(f"{key}: spec {got['spec']} shard {got['shard_shape']}"
                      f", want {want} shard {want_shard}")
  assert not problems, "\n".join(problems)


def test_tensor_and_fsdp_meshes_really_split(results):
  """Spot checks written out by hand, so a wrong rule table cannot hide."""
  k = "['params']['encoder']['attention']['query']['kernel']"  # L,H,heads,kv
  w = "['params']['embeddings']['word_embeddings']['embedding']"  # V, E
  f = "['params']['encoder']['ffn']['intermediate']['kernel']"  # L, H, mlp
  mu = "['opt_state'][1][0].mu['encoder']['ffn']['intermediate']['kernel']"
  meshes = results["meshes"]
  tensor = meshes["tensor"]["final"]
  assert tensor[k]["spec"] == [(), (), ("tensor",), ()]
  assert tensor[k]["shard_shape"] == (1, 32, 1, 8)
  assert tensor[w]["spec"] == [("tensor",), ()]
  assert tensor[w]["shard_shape"] == (32, 16)
  assert tensor[f]["shard_shape"] == (1, 32, 16)
  assert tensor[mu]["shard_shape"] == (1, 32, 16)
  fsdp = meshes["fsdp"]["final"]
  assert fsdp[k]["spec"] == [(), ("fsdp",), (), ()]
  assert fsdp[k]["shard_shape"] == (1, 8, 4, 8)
  assert fsdp[f]["shard_shape"] == (1, 8, 64)
  assert fsdp[mu]["shard_shape"] == (1, 8, 64)
  assert fsdp[w]["shard_shape"] == (128, 16)
  for leaf in meshes["data"]["final"].values():
    assert leaf["shard_shape"] == leaf["shape"]


# --- Batches. ---


@pytest.mark.parametrize("mesh_name", list(worker.MESHES))
def test_batch_is_sharded_over_the_data_axes(results, mesh_name):
  """The worker places batches with `data_sharding` and feeds those to the
  jitted step, whose in_shardings would reject any other placement."""
  r = results["meshes"][mesh_name]
  data_axes = tuple(a for a in DATA_AXES if a in r["mesh"])
  size = int(np.prod([r["mesh"][a] for a in data_axes]))
  assert r["data_parallel_size"] == size
  assert size == {"single": 1, "data": 8, "fsdp": 8, "tensor": 2}[mesh_name]
  assert set(r["batch"]) == {f"['{k}']" for k in BATCH_KEYS}
  for key, got in r["batch"].items():
    assert got["spec"] == [data_axes] + [()] * (len(got["shape"]) - 1), key
    assert got["shard_shape"] == (
        (worker.BATCH_SIZE // size,) + got["shape"][1:]), key
    assert got["num_devices"] == worker.MESHES[mesh_name][1]


class _FakeSharding:
  """Stands in for a multi-process sharding: given local device indices."""

  def __init__(self, *row_ranges):
    self.row_ranges = row_ranges

  def addressable_devices_indices_map(self, shape):
    del shape
    return {d: (slice(*r),) for d, r in enumerate(self.row_ranges)}


def test_process_batch_rows():
  one = jax.sharding.NamedSharding(
      sharding.make_mesh([("data", -1)]), jax.sharding.PartitionSpec("data"))
  assert sharding.process_batch_rows(one, 8) == slice(0, 8)
  assert sharding.process_batch_rows(
      _FakeSharding((4, 6), (6, 8)), 8) == slice(4, 8)
  # Replicas (a model axis inside the process) hold the same rows.
  assert sharding.process_batch_rows(
      _FakeSharding((2, 4), (2, 4), (4, 6), (4, 6)), 8) == slice(2, 6)
  with pytest.raises(ValueError, match="not one contiguous range"):
    sharding.process_batch_rows(_FakeSharding((0, 2), (4, 6)), 8)


# --- Numerics: every mesh trains like one device. ---


def _max_diff(a, b):
  diffs = jax.tree.map(lambda x, y: float(np.max(np.abs(x - y))), a, b)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  return max(jax.tree.leaves(diffs))


@pytest.mark.parametrize("mesh_name", SHARDED_MESHES)
def test_matches_single_device(results, mesh_name):
  single = results["meshes"]["single"]
  r = results["meshes"][mesh_name]
  assert np.isfinite(single["loss"]) and single["loss"] > 0
  assert abs(r["loss"] - single["loss"]) <= TOLERANCE
  grad_norm = np.sqrt(sum(float(np.sum(g**2))
                          for g in jax.tree.leaves(single["grads"])))
  assert grad_norm > 1e-3  # the comparison below is not of zeros
  assert _max_diff(r["grads"], single["grads"]) <= TOLERANCE
  np.testing.assert_allclose(r["losses"], single["losses"], rtol=0,
                             atol=TOLERANCE)
  assert len(r["losses"]) == worker.NUM_STEPS
  assert _max_diff(r["params"], single["params"]) <= TOLERANCE
  # Training moved the parameters (so equal params are not just the init).
  assert r["param_change"] > 100 * TOLERANCE

