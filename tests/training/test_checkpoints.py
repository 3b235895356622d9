"""`albert_jax.training.checkpoints` and `load_pretrained` on a training workdir.

States are the trainer's real state structure ({"step", "params",
"opt_state", "rng"} of the tiny model with its LAMB optimizer and the
shardings `pretrain.run` computes), filled with random values instead of being
trained, so nothing here compiles a train step. Checkpoints saved on a
4-device mesh are written by a subprocess with fake CPU devices (this
process's JAX has one device) and restored both there, onto other meshes,
and here, onto one CPU device.
"""

import errno
import glob
import logging
import os
import shutil
import subprocess
import sys
import textwrap

from absl import logging as absl_logging
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from albert_jax import config_lib
from albert_jax import sharding as sharding_lib
from albert_jax.interop import CheckpointError
from albert_jax.interop.pretrained import load_pretrained
from albert_jax.model import albert as albert_lib
from albert_jax.model.config import ModelConfig
from albert_jax.training import checkpoint_shapes
from albert_jax.training import checkpoints
from albert_jax.training import optimizer as optim
from albert_jax.training import run_setup
from albert_jax.training import run_spec
from albert_jax.training import state as state_lib
from locations import REPO
from locations import TESTS
VOCAB, SEQ, PREDICTIONS = 300, 32, 5


def tiny_config(hidden_size=64, objective="sop", mesh=None):
  """configs/tiny.py's config, sized like the tests' data."""
  c = config_lib.base_config(
      config_lib.tiny_model(vocab_size=VOCAB, hidden_size=hidden_size),
      objective=objective, batch_size=8, num_train_steps=10, warmup_steps=2,
      max_seq_length=SEQ, max_predictions=PREDICTIONS)
  if mesh is not None:
    c.mesh = mesh
  return c


def abstract_state(config, mesh=None):
  """(abstract unboxed state, shardings) exactly as `pretrain.run` builds them."""
  mesh = mesh or sharding_lib.make_mesh(config.mesh)
  rules = sharding_lib.rules_for(mesh,
                                 [tuple(r) for r in config.sharding_rules])
  spec = run_spec.run_spec(config)
  tx, _ = optim.make(config.optimizer, config.num_train_steps)
  init = state_lib.state_init_fn(spec.init_params, tx)
  return state_lib.abstract_state(init, tx, mesh, rules, jax.random.key(0))


def random_state(abstract, shardings, step, seed=0):
  """Random values of the abstract state's shapes, placed on `shardings`."""
  rng = np.random.default_rng(seed)

  def fill(leaf, sharding):
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      value = rng.standard_normal(leaf.shape).astype(leaf.dtype)
    else:
      value = rng.integers(0, 1000, leaf.shape).astype(leaf.dtype)
    return jax.device_put(value, sharding)
  state = jax.tree.map(fill, abstract, shardings)
  state["step"] = jax.device_put(np.int32(step), shardings["step"])
  return state


def assert_trees_equal(a, b):
  """Bitwise equality of every leaf (and of the tree structure)."""
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0],
                          jax.tree.leaves(b)):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype, jax.tree_util.keystr(path)
    np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))


def save_all(workdir, states, metrics=None, **kw):
  mngr = checkpoints.manager(workdir, **kw)
  for i, state in enumerate(states):
    step = int(state["step"])
    checkpoints.save(mngr, state, {"step": step, "data_position": step},
                     metrics=metrics[i] if metrics else None)
  mngr.wait_until_finished()
  return mngr


def steps_on_disk(workdir):
  return sorted(int(n) for n in os.listdir(checkpoints.checkpoint_dir(workdir))
                if n.isdigit())


@pytest.fixture(scope="module")
def tiny():
  """The tiny model's abstract state and single-device shardings."""
  return abstract_state(tiny_config())


def test_round_trip(tiny, tmp_path):
  abstract, shardings = tiny
  state = random_state(abstract, shardings, step=7)
  save_all(tmp_path, [state])
  restored, meta = checkpoints.restore_latest(
      checkpoints.manager(tmp_path), abstract, shardings)
  assert_trees_equal(restored, state)
  assert meta == {"step": 7, "data_position": 7}
  for leaf, sharding in zip(jax.tree.leaves(restored),
                            jax.tree.leaves(shardings)):
    assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)


def test_empty_workdir_restores_nothing(tiny, tmp_path):
  abstract, shardings = tiny
  assert checkpoints.restore_latest(checkpoints.manager(tmp_path), abstract,
                                    shardings) is None
  assert checkpoints.available_steps(tmp_path) == []
  with pytest.raises(FileNotFoundError, match="No checkpoints"):
    checkpoints.restore_params(tmp_path, abstract["params"])


def _small_states(steps):
  return [{"step": jnp.int32(s), "params": {"w": jnp.full((2, 3), float(s))}}
          for s in steps]


def test_a_save_the_disk_has_no_room_for_is_refused_before_writing(
    tmp_path, monkeypatch):
  mngr = save_all(tmp_path, _small_states([1]))
  free = {"bytes": 3 * 2**20}  # under the 4 MiB margin for metadata
  usage = shutil.disk_usage
  monkeypatch.setattr(
      checkpoints.shutil, "disk_usage",
      lambda path: usage(path)._replace(free=free["bytes"]))
  with pytest.raises(checkpoints.CheckpointWriteError) as error:
    checkpoints.save(mngr, _small_states([2])[0], {"step": 2})
  assert error.value.errno == errno.ENOSPC
  assert str(error.value) == (
      f"Writing checkpoint step 2 to {tmp_path}/checkpoints failed (it "
      "needs about 4.0 MiB and the disk has 3.0 MiB free). The complete "
      "checkpoints (steps [1]) are intact and the incomplete one is never "
      "restored: a rerun resumes from step 1. Free space on that disk (or "
      "lower config.keep_checkpoints, or choose another --workdir) and run "
      "again.")
  assert os.listdir(checkpoints.checkpoint_dir(tmp_path)) == ["1"]
  # A step the manager would not save anyway is not refused.
  assert not checkpoints.save(mngr, _small_states([1])[0], {"step": 1})
  free["bytes"] = 5 * 2**20
  assert checkpoints.save(mngr, _small_states([2])[0], {"step": 2})
  mngr.wait_until_finished()
  assert steps_on_disk(tmp_path) == [1, 2]


def test_retention_keeps_latest_and_best(tmp_path):
  accuracy = [0.1, 0.9, 0.3, 0.2, 0.4, 0.5]
  save_all(tmp_path, _small_states(range(1, 7)),
           metrics=[{"mlm_accuracy": a} for a in accuracy], keep=2,
           best_metric="mlm_accuracy")
  assert steps_on_disk(tmp_path) == [2, 5, 6]


def test_retention_best_by_minimum(tmp_path):
  loss = [3.0, 1.0, 0.5, 2.0, 4.0]
  save_all(tmp_path, _small_states(range(1, 6)),
           metrics=[{"mlm_loss": l} for l in loss], keep=1,
           best_metric="mlm_loss", best_mode="min")
  assert steps_on_disk(tmp_path) == [3, 5]


def test_best_step_is_the_metrics_and_survives_a_restart(tmp_path):
  """best_step() ranks by the metric (not the newest step), and a resumed
  run's manager reads the saved metrics back, so it keeps the best too."""
  kw = dict(keep=1, best_metric="mlm_loss", best_mode="min")
  mngr = save_all(tmp_path, _small_states(range(1, 6)),
                  metrics=[{"mlm_loss": l} for l in [3.0, 1.0, 0.5, 2.0, 4.0]],
                  **kw)
  assert mngr.best_step() == 3
  again = checkpoints.manager(tmp_path, **kw)
  assert again.best_step() == 3
  (state,) = _small_states([6])
  checkpoints.save(again, state, {"step": 6, "data_position": 6},
                   metrics={"mlm_loss": 5.0})
  again.wait_until_finished()
  assert again.best_step() == 3
  assert steps_on_disk(tmp_path) == [3, 6]


def test_checkpoints_without_metrics_are_not_kept_as_best(tmp_path):
  metrics = [{"mlm_accuracy": 0.9}, None, {"mlm_accuracy": 0.1}, None]
  save_all(tmp_path, _small_states(range(1, 5)), metrics=metrics, keep=1,
           best_metric="mlm_accuracy")
  assert steps_on_disk(tmp_path) == [1, 4]



def test_saves_between_evaluations_do_not_warn(tmp_path, caplog):
  """orbax warns at every save without metrics when a best metric is
  tracked; the trainer saves that way by design, so the manager drops that
  one warning during its saves, and only that one."""
  caplog.set_level(logging.WARNING)
  metrics = [{"mlm_accuracy": 0.5}, None]
  save_all(tmp_path, _small_states(range(1, 3)), metrics=metrics, keep=1,
           best_metric="mlm_accuracy")
  assert not [r for r in caplog.records
              if "did not provide metrics" in r.getMessage()]
  absl_logging.warning("Requested `tracked_metric`; did not provide metrics.")
  assert [r for r in caplog.records
          if "did not provide metrics" in r.getMessage()]

_MESH_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import jax, numpy as np
    sys.path[:0] = [{here!r}, {tests!r}]
    import test_checkpoints as t
    from albert_jax import sharding as sharding_lib
    from albert_jax.training import checkpoints
    assert jax.device_count() == 4, jax.devices()
    workdir = sys.argv[1]

    def on(mesh_axes):
      config = t.tiny_config(mesh=mesh_axes)
      return t.abstract_state(config, sharding_lib.make_mesh(config.mesh))

    # Saved from FSDP x tensor parallelism on a 2x2 mesh ...
    abstract, saved_on = on([("data", 1), ("fsdp", 2), ("tensor", 2)])
    state = t.random_state(abstract, saved_on, step=5, seed=1)
    split = [k for k, s in jax.tree_util.tree_flatten_with_path(saved_on)[0]
             if not s.is_fully_replicated]
    assert len(split) > 10, split
    t.save_all(workdir, [state])
    np.savez(os.path.join(workdir, "expected.npz"), **{{
        jax.tree_util.keystr(k): np.asarray(v)
        for k, v in jax.tree_util.tree_flatten_with_path(state)[0]}})
    # ... restores onto data parallelism over 4 and onto FSDP over 4.
    for axes in ([("data", 4), ("fsdp", 1), ("tensor", 1)],
                 [("data", 1), ("fsdp", 4), ("tensor", 1)]):
      abstract, target = on(axes)
      restored, meta = checkpoints.restore_latest(
          checkpoints.manager(workdir), abstract, target)
      t.assert_trees_equal(restored, state)
      for leaf, sharding in zip(jax.tree.leaves(restored),
                                jax.tree.leaves(target)):
        assert leaf.sharding == sharding, (leaf.sharding, sharding)
    params, step = checkpoints.restore_params(workdir, abstract["params"])
    t.assert_trees_equal(params, state["params"])
    assert step == 5
    cpu0 = jax.local_devices(backend="cpu")[0]
    assert all(p.sharding.device_set == {{cpu0}}
               for p in jax.tree.leaves(params))
    print("MESH-OK")
""")


def test_restores_onto_other_meshes_and_one_device(tiny, tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "")
                       + " --xla_force_host_platform_device_count=4")}
  script = _MESH_SCRIPT.format(here=os.path.dirname(os.path.abspath(__file__)),
                               tests=str(TESTS))
  proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)],
                        env=env, cwd=REPO, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0 and "MESH-OK" in proc.stdout, (
      proc.stdout + proc.stderr[-5000:])
  # This process has one device: the 4-device checkpoint restores onto it.
  expected = dict(np.load(tmp_path / "expected.npz"))
  abstract, shardings = tiny
  restored, meta = checkpoints.restore_latest(
      checkpoints.manager(tmp_path), abstract, shardings)
  assert meta["step"] == 5
  flat = jax.tree_util.tree_flatten_with_path(restored)[0]
  assert len(flat) == len(expected)
  for path, leaf in flat:
    np.testing.assert_array_equal(np.asarray(leaf),
                                  expected[jax.tree_util.keystr(path)])
  params, _ = checkpoints.restore_params(tmp_path, abstract["params"])
  assert_trees_equal(params, restored["params"])


def _data_files(workdir, step):
  files = glob.glob(os.path.join(checkpoints.checkpoint_dir(workdir),
                                 str(step), "state", "**", "d", "*"),
                    recursive=True)
  assert files
  return files


# Tensorstore reports the other arrays' reads after orbax's event loop closed.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_corrupt_latest_falls_back_to_previous(tiny, tmp_path, caplog,
                                               damage):
  abstract, shardings = tiny
  states = [random_state(abstract, shardings, step=s, seed=s)
            for s in (1, 2, 3)]
  save_all(tmp_path, states, keep=5)
  for path in _data_files(tmp_path, 3):
    if damage == "truncate":
      with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    else:
      os.remove(path)
  with caplog.at_level(logging.WARNING, logger="albert_jax.training.checkpoints"):
    params, step = checkpoints.restore_params(tmp_path, abstract["params"])
    assert step == 2
    assert_trees_equal(params, states[1]["params"])
    mngr = checkpoints.manager(tmp_path, keep=5)
    restored, meta = checkpoints.restore_latest(mngr, abstract, shardings)
  assert meta["step"] == 2
  assert_trees_equal(restored, states[1])
  warnings = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING]
  assert any("step 3" in w and "previous" in w for w in warnings), warnings
  # The unreadable checkpoint is set aside, so step 3 can be saved again.
  assert os.path.isdir(os.path.join(mngr.directory, "3.unreadable"))
  assert mngr.all_steps() == [1, 2]
  checkpoints.save(mngr, states[2], {"step": 3})
  mngr.wait_until_finished()
  restored, _ = checkpoints.restore_latest(checkpoints.manager(tmp_path),
                                           abstract, shardings)
  assert_trees_equal(restored, states[2])


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_all_checkpoints_unreadable_is_an_error(tiny, tmp_path):
  abstract, shardings = tiny
  save_all(tmp_path, [random_state(abstract, shardings, step=1)])
  for path in _data_files(tmp_path, 1):
    os.remove(path)
  with pytest.raises(checkpoints.UnreadableCheckpointError, match=r"\[1\]"):
    checkpoints.restore_latest(checkpoints.manager(tmp_path), abstract,
                               shardings)


def test_half_written_checkpoint_is_never_restored(tiny, tmp_path):
  abstract, shardings = tiny
  states = [random_state(abstract, shardings, step=s, seed=s)
            for s in (1, 2, 3)]
  save_all(tmp_path, states[:2])
  # A complete-looking step 3 under orbax's in-progress name, as a save
  # killed before its final rename leaves it.
  other = tmp_path / "other"
  save_all(other, states[2:])
  ckpt = checkpoints.checkpoint_dir(tmp_path)
  os.rename(os.path.join(checkpoints.checkpoint_dir(other), "3"),
            os.path.join(ckpt, "3.orbax-checkpoint-tmp"))
  assert checkpoints.available_steps(tmp_path) == [1, 2]
  params, step = checkpoints.restore_params(tmp_path, abstract["params"])
  assert step == 2
  assert_trees_equal(params, states[1]["params"])
  restored, meta = checkpoints.restore_latest(checkpoints.manager(tmp_path),
                                              abstract, shardings)
  assert meta["step"] == 2
  assert_trees_equal(restored, states[1])


def test_shape_mismatch_lists_paths(tiny, tmp_path):
  abstract, shardings = tiny
  save_all(tmp_path, [random_state(abstract, shardings, step=4)])
  other, other_shardings = abstract_state(tiny_config(hidden_size=48))
  with pytest.raises(checkpoint_shapes.CheckpointShapeError) as e:
    checkpoints.restore_latest(checkpoints.manager(tmp_path), other,
                               other_shardings)
  message = str(e.value)
  assert e.value.step == 4
  # Parameters and their optimizer slots, each with both shapes.
  assert ("params/encoder/embedding_hidden_mapping_in/kernel: checkpoint "
          "(32, 64), model (32, 48)") in message, message
  assert "params/pooler/bias: checkpoint (64,), model (48,)" in message
  paths = {p for p, _, _ in e.value.problems}
  assert any(p.startswith("opt_state/") and p.endswith("pooler/kernel")
             for p in paths), sorted(paths)
  with pytest.raises(checkpoint_shapes.CheckpointShapeError,
                     match="embedding_hidden_mapping_in"):
    checkpoints.restore_params(tmp_path, other["params"])


################################################################################
# load_pretrained on a training workdir.
################################################################################


@pytest.fixture(name="spm_model", scope="module")
def fixture_spm_model(tiny_tokenizer):
  """conftest's 300-piece SentencePiece model: its path."""
  assert tiny_tokenizer.vocab_size == VOCAB
  return tiny_tokenizer.path


def make_workdir(path, config, states, spm=None):
  """A workdir as the trainer leaves it: config.json, spm/, checkpoints/."""
  run_setup.prepare_workdir(str(path))
  run_setup.record_config(config, str(path))
  if spm:
    os.makedirs(path / "spm", exist_ok=True)
    shutil.copy(spm, path / "spm" / "spiece.model")
  save_all(path, states)
  return str(path)


def _inputs():
  rng = np.random.default_rng(0)
  ids = rng.integers(5, VOCAB, (2, 11)).astype(np.int32)
  types = np.zeros_like(ids)
  types[:, 6:] = 1
  mask = np.ones_like(ids)
  mask[1, 9:] = 0
  return ids, types, mask


def test_load_pretrained_workdir(tiny, tmp_path, spm_model):
  abstract, shardings = tiny
  states = [random_state(abstract, shardings, step=s, seed=s)
            for s in (5, 10)]
  workdir = make_workdir(tmp_path / "run", tiny_config(), states, spm_model)
  model = load_pretrained(workdir)
  assert model.step == 10
  assert model.heads == ("mlm", "sop") and model.pooler and not model.missing
  assert model.model_config == ModelConfig.from_dict(tiny_config().model)
  assert_trees_equal(model.params, states[1]["params"])
  cpu0 = jax.local_devices(backend="cpu")[0]
  assert all(p.sharding.device_set == {cpu0}
             for p in jax.tree.leaves(model.params))
  assert model.tokenizer is not None and model.tokenizer.vocab_size == VOCAB

  ids, types, mask = _inputs()
  out = model(ids, types, mask)
  module = albert_lib.Albert(model.model_config, heads=("mlm", "sop"))
  want = jax.jit(lambda p, i, t, m: module.apply({"params": p}, i, t, m))(
      states[1]["params"], jnp.asarray(ids), jnp.asarray(types),
      jnp.asarray(mask))
  assert set(out) == set(want) >= {"mlm_logits", "sop_logits"}
  for key in want:
    np.testing.assert_array_equal(np.asarray(out[key]),
                                  np.asarray(want[key]), err_msg=key)

  # An older step on request; then the HF export of a share=all model.
  older = load_pretrained(workdir, step=5)
  assert older.step == 5
  assert_trees_equal(older.params, states[0]["params"])
  hf_dir = tmp_path / "hf"
  model.to_hf(str(hf_dir))
  assert (hf_dir / "spiece.model").exists()
  again = load_pretrained(str(hf_dir))
  assert again.heads == model.heads and again.tokenizer is not None
  assert again.model_config == model.model_config
  assert_trees_equal(again.params, model.params)


def test_load_pretrained_workdir_without_sop_head(tmp_path):
  config = tiny_config(objective="none")
  abstract, shardings = abstract_state(config)
  assert "sop_classifier" not in str(jax.tree.structure(abstract["params"]))
  state = random_state(abstract, shardings, step=3)
  # The tokenizer the config names (missing here) is only warned about.
  config.data.tokenizer = str(tmp_path / "gone" / "spiece.model")
  model = load_pretrained(make_workdir(tmp_path / "run", config, [state]))
  assert model.heads == ("mlm",) and model.tokenizer is None
  assert_trees_equal(model.params, state["params"])


def test_load_pretrained_workdir_errors(tiny, tmp_path):
  abstract, shardings = tiny
  empty = tmp_path / "empty"
  run_setup.prepare_workdir(str(empty))
  run_setup.record_config(tiny_config(), str(empty))
  with pytest.raises(CheckpointError, match="No checkpoints"):
    load_pretrained(str(empty))

  workdir = make_workdir(tmp_path / "run", tiny_config(),
                         [random_state(abstract, shardings, step=2)])
  with pytest.raises(CheckpointError, match=r"available steps: \[2\]"):
    load_pretrained(workdir, step=7)
  # config.json rewritten for another hidden size (as a rerun with another
  # config would leave it): the mismatched parameters are listed.
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    f.write(tiny_config(hidden_size=48).to_json_best_effort())
  with pytest.raises(CheckpointError) as e:
    load_pretrained(workdir)
  message = str(e.value)
  assert "params/pooler/bias: checkpoint (64,), model (48,)" in message
  assert "encoder/embedding_hidden_mapping_in/kernel" in message, message
  assert "opt_state" not in message  # only parameters are read
  # Overrides of shape-defining fields are checked the same way.
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    f.write(tiny_config().to_json_best_effort())
  with pytest.raises(CheckpointError, match="intermediate"):
    load_pretrained(workdir, intermediate_size=96)
  with pytest.raises(CheckpointError, match="no config.json"):
    os.remove(os.path.join(workdir, "config.json"))
    load_pretrained(workdir)
