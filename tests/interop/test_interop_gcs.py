"""Checkpoint directories on gs:// (the Cloud Storage emulator): `to_hf`
writes there and `load_pretrained` reads HF directories and TF releases from
there exactly as from a local directory."""

import os

import jax
import ml_collections
import numpy as np
import pytest

from albert_jax import storage
from albert_jax.interop import CheckpointError
from albert_jax.interop.pretrained import load_pretrained
from albert_jax.interop.pretrained import Pretrained
from albert_jax.model import albert as albert_lib
from albert_jax.model.config import ModelConfig

CFG = ModelConfig(vocab_size=40, embedding_size=8, hidden_size=16,
                  num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=24, max_position_embeddings=16)


def _tiny_model() -> Pretrained:
  """ALBERT with MLM and SOP heads, random float32 weights, no tokenizer."""
  shapes = albert_lib.abstract_params(CFG, True, ("mlm", "sop"))
  rng = np.random.default_rng(0)
  params = jax.tree.map(
      lambda s: rng.standard_normal(s.shape).astype(np.float32), shapes)
  return Pretrained(config=ml_collections.ConfigDict(CFG.to_dict()),
                    model_config=CFG, params=params, heads=("mlm", "sop"),
                    pooler=True)


def _files(root: str) -> dict[str, bytes]:
  return {p.name: p.read_bytes() for p in storage.path(root).iterdir()}


def _upload(local_dir, remote_dir: str) -> None:
  for name in os.listdir(local_dir):
    storage.path(f"{remote_dir}/{name}").write_bytes(
        (local_dir / name).read_bytes())


def _assert_same_params(a, b):
  flat_a = jax.tree_util.tree_flatten_with_path(a)[0]
  flat_b = dict(jax.tree_util.tree_flatten_with_path(b)[0])
  assert [k for k, _ in flat_a] == list(flat_b)
  for key, value in flat_a:
    np.testing.assert_array_equal(np.asarray(value), np.asarray(flat_b[key]),
                                  err_msg=jax.tree_util.keystr(key))


def test_to_hf_on_gcs_round_trips_exactly(gcs_bucket, tmp_path):
  model = _tiny_model()
  remote = f"{gcs_bucket}/exports/albert"
  model.to_hf(remote)
  model.to_hf(str(tmp_path))
  # The same files, byte for byte, as a local export.
  assert _files(remote) == _files(str(tmp_path))
  assert sorted(_files(remote)) == ["config.json", "model.safetensors"]
  loaded = load_pretrained(remote)
  assert (loaded.model_config, loaded.heads, loaded.pooler) == (
      CFG, ("mlm", "sop"), True)
  _assert_same_params(loaded.params, model.params)


def test_sharded_hf_directory_on_gcs(gcs_bucket, tmp_path):
  """A sharded safetensors checkpoint: the index and every shard are read
  from gs://; a missing shard is named."""
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  model = _tiny_model()
  model.to_hf(str(tmp_path))
  state = load_file(tmp_path / "model.safetensors")
  names = sorted(state)
  half = len(names) // 2
  shards = {"model-00001-of-00002.safetensors": names[:half],
            "model-00002-of-00002.safetensors": names[half:]}
  for file, keys in shards.items():
    save_file({k: state[k] for k in keys}, tmp_path / file)
  (tmp_path / "model.safetensors").unlink()
  (tmp_path / "model.safetensors.index.json").write_text(
      '{"weight_map": {' + ", ".join(
          f'"{k}": "{f}"' for f, keys in shards.items() for k in keys) + "}}")
  remote = f"{gcs_bucket}/sharded"
  _upload(tmp_path, remote)
  _assert_same_params(load_pretrained(remote).params, model.params)
  storage.path(f"{remote}/model-00002-of-00002.safetensors").unlink()
  with pytest.raises(CheckpointError) as error:
    load_pretrained(remote)
  assert str(error.value) == (
      f"{remote}/model.safetensors.index.json names shard file(s) that are "
      f"not in {remote}: ['model-00002-of-00002.safetensors']. The download "
      "is incomplete: fetch every shard.")


def test_missing_gcs_directory_is_named_as_given(gcs_bucket):
  with pytest.raises(CheckpointError) as error:
    load_pretrained(f"{gcs_bucket}/nowhere")
  assert str(error.value) == (
      f"{gcs_bucket}/nowhere is not a directory (no object is stored under "
      "it).")
  storage.path(f"{gcs_bucket}/no_config/model.safetensors").write_bytes(b"")
  with pytest.raises(CheckpointError, match="^" + f"{gcs_bucket}/no_config "
                     "has no config.json;"):
    load_pretrained(f"{gcs_bucket}/no_config")


def test_tf_release_on_gcs_equals_local(gcs_bucket, tmp_path):
  """The TF reader gets a staged local copy of the gs:// checkpoint files."""
  pytest.importorskip("tensorflow")
  pytest.importorskip("transformers")
  from test_tf_checkpoint import build_hf  # pylint: disable=g-import-not-at-top
  from test_tf_checkpoint import official_config  # pylint: disable=g-import-not-at-top
  from test_tf_checkpoint import official_variables  # pylint: disable=g-import-not-at-top
  from test_tf_checkpoint import STEP  # pylint: disable=g-import-not-at-top
  from test_tf_checkpoint import with_optimizer_state  # pylint: disable=g-import-not-at-top
  from test_tf_checkpoint import write_release  # pylint: disable=g-import-not-at-top
  local = write_release(
      tmp_path / "release",
      with_optimizer_state(official_variables(build_hf(seed=3))),
      official_config())
  remote = f"{gcs_bucket}/albert_tiny"
  _upload(tmp_path / "release", remote)
  want, got = load_pretrained(local), load_pretrained(remote)
  assert (got.step, got.heads, got.model_config) == (
      STEP, want.heads, want.model_config)
  _assert_same_params(got.params, want.params)
  with pytest.raises(CheckpointError) as error:
    load_pretrained(remote, step=7)
  assert str(error.value) == (
      f"{remote} has no checkpoint model.ckpt-7; it holds "
      f"['model.ckpt-{STEP}'].")
