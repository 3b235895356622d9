"""albert_jax ↔ HF transformers ALBERT: parity, round trips and load errors.

Every reference model is a tiny, randomly initialised transformers model built
here (no hub access), with every parameter perturbed so that LayerNorm scales,
biases and the MLM bias (which HF initialises to 1 / 0) are exercised too
(tests/interop/hf_helpers.py). All comparisons are float32 on CPU.

Padding: HF lets padded *query* rows attend to the real tokens, while
albert_jax's attention returns a zero context for padded query rows (segment
id 0), so the two differ at padding positions only. Padded keys are masked
identically, and rows never mix outside attention, so they agree at every
non-padding position, and only there are sequence outputs and MLM logits
compared. Pooled output and SOP logits read position 0, which is never
padding here.
"""

import json
import logging
import os
import pickle
import shutil
import sys

import flax.linen as nn
from hf_helpers import assert_parity
from hf_helpers import assert_trees_equal
from hf_helpers import build_hf
from hf_helpers import hf_outputs
from hf_helpers import Zoo
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from safetensors.numpy import load_file

from albert_jax.interop import CheckpointError
from albert_jax.interop import hf_config as hf_config_lib
from albert_jax.interop.hf_config import CONFIG_KEYS
from albert_jax.interop.pretrained import Pretrained
from albert_jax.interop.pretrained import load_pretrained
from albert_jax.model import albert as albert_lib
from albert_jax.model import layers
from albert_jax.model.config import ModelConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

VOCAB, MAX_POS = 67, 24
BATCH, LENGTH = 3, 11

# Tiny shapes that between them cover what the conversion has to get right.
CASES = {
    # E≠H; 2 groups over 3 layers (layers 0, 1 → group 0; layer 2 → group 1)
    # with 2 inner layers each; exact erf GELU.
    "groups": dict(embedding_size=16, hidden_size=32, num_attention_heads=4,
                   intermediate_size=37, num_hidden_layers=3,
                   num_hidden_groups=2, inner_group_num=2, hidden_act="gelu"),
    # E=H, one shared layer, tanh GELU (ALBERT's released checkpoints).
    "gelu_new": dict(embedding_size=24, hidden_size=24, num_attention_heads=3,
                     intermediate_size=40, num_hidden_layers=2,
                     hidden_act="gelu_new"),
    # Every layer its own group, ReLU, wide heads, three token types.
    "relu": dict(embedding_size=8, hidden_size=64, num_attention_heads=2,
                 intermediate_size=48, num_hidden_layers=4,
                 num_hidden_groups=4, hidden_act="relu", type_vocab_size=3),
}

AUTO_CLASS = {"AlbertForPreTraining": "AutoModelForPreTraining",
              "AlbertForMaskedLM": "AutoModelForMaskedLM",
              "AlbertModel": "AutoModel"}


def hf_config(case):
  return transformers.AlbertConfig(vocab_size=VOCAB,
                                   max_position_embeddings=MAX_POS,
                                   **CASES[case])


def make_inputs(type_vocab_size, seed=0):
  """[B, T] ids, token types and a right-padded mask (rows of 11, 7, 3)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, VOCAB, (BATCH, LENGTH))
  token_types = rng.integers(0, type_vocab_size, (BATCH, LENGTH))
  mask = np.ones((BATCH, LENGTH), np.int64)
  mask[1, 7:] = 0
  mask[2, 3:] = 0
  return ids, token_types, mask


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
  return Zoo(str(tmp_path_factory.mktemp("hf_checkpoints")), hf_config,
             default=("groups", "AlbertForPreTraining"))


@pytest.fixture(scope="module")
def reference(zoo):
  """The default pre-training checkpoint loaded once (float32)."""
  return load_pretrained(zoo.saved()[1])


# --------------------------------------------------------------------------
# 1. Numerical parity.


@pytest.mark.parametrize("case", list(CASES))
def test_pretraining_parity(zoo, case):
  """Sequence, pooled, MLM and SOP outputs match HF, padded and unpadded."""
  model, path = zoo.saved(case)
  pt = load_pretrained(path)
  assert pt.heads == ("mlm", "sop") and pt.pooler and pt.missing == ()
  ids, token_types, mask = make_inputs(model.config.type_vocab_size)
  assert_parity(pt(ids, token_types, mask),
                hf_outputs(model, ids, token_types, mask), mask)
  # Defaults: no token types (all segment A) and no padding.
  assert_parity(pt(ids), hf_outputs(model, ids))


def test_masked_lm_checkpoint_has_no_pooler_or_sop(zoo, caplog):
  """AlbertForMaskedLM: no pooler, no SOP; they are reported, not invented."""
  model, path = zoo.saved("groups", "AlbertForMaskedLM")
  with caplog.at_level(logging.WARNING, logger="albert_jax.interop.pretrained"):
    pt = load_pretrained(path)
  assert pt.missing == ("pooler", "sop")
  assert pt.heads == ("mlm",) and not pt.pooler
  assert "pooler" not in pt.params and "sop" not in pt.params
  warnings = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING]
  assert any("pooler" in w and "sop" in w and path in w for w in warnings)
  ids, token_types, mask = make_inputs(2)
  out = pt(ids, token_types, mask)
  assert set(out) == {"sequence_output", "mlm_logits"}
  assert_parity(out, hf_outputs(model, ids, token_types, mask), mask)


def test_base_model_checkpoint_without_prefix(zoo, caplog):
  """AlbertModel: keys lack `albert.`; pooler only, both heads missing."""
  model, path = zoo.saved("groups", "AlbertModel")
  keys = load_file(os.path.join(path, "model.safetensors"))
  assert keys and not any(k.startswith("albert.") for k in keys)
  with caplog.at_level(logging.WARNING, logger="albert_jax.interop.pretrained"):
    pt = load_pretrained(path)
  assert pt.missing == ("mlm", "sop") and pt.heads == () and pt.pooler
  assert any("mlm" in r.getMessage() and "sop" in r.getMessage()
             for r in caplog.records)
  ids, token_types, mask = make_inputs(2)
  out = pt(ids, token_types, mask)
  assert set(out) == {"sequence_output", "pooled_output"}
  assert_parity(out, hf_outputs(model, ids, token_types, mask), mask)


def test_bfloat16_compute_override(zoo):
  """dtype="bfloat16" computes in bf16 from float32 weights, close to HF."""
  model, path = zoo.saved()
  pt = load_pretrained(path, dtype="bfloat16")
  assert pt.model_config.dtype == "bfloat16"
  assert pt.config.dtype == "bfloat16"
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(pt.params))
  ids, token_types, mask = make_inputs(2)
  out = pt(ids, token_types, mask)
  assert out["sequence_output"].dtype == jnp.bfloat16
  ref = hf_outputs(model, ids, token_types, mask)
  keep = mask.astype(bool)
  # Observed: max 0.025, 0.008, 0.017, 0.003; mean about a fifth of that.
  for name, atol in (("sequence_output", 0.06), ("pooled_output", 0.03),
                     ("mlm_logits", 0.06), ("sop_logits", 0.02)):
    got = np.asarray(out[name], np.float32)
    want = ref[name]
    if name in ("sequence_output", "mlm_logits"):
      got, want = got[keep], want[keep]
    err = np.abs(got - want)
    assert err.max() <= atol, (name, err.max())
    assert err.mean() <= atol / 4, (name, err.mean())


def test_param_dtype_override_casts_weights(zoo):
  pt = load_pretrained(zoo.saved()[1], param_dtype="bfloat16")
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(pt.params))


# --------------------------------------------------------------------------
# 2. Writing HF checkpoints.


@pytest.mark.parametrize("cls_name", list(AUTO_CLASS))
def test_to_hf_round_trip_is_exact(zoo, tmp_path, cls_name):
  """HF → albert_jax → HF: same class, no loading complaints, same bits."""
  model, path = zoo.saved("groups", cls_name)
  load_pretrained(path).to_hf(str(tmp_path))
  auto = getattr(transformers, AUTO_CLASS[cls_name])
  back, info = auto.from_pretrained(str(tmp_path), output_loading_info=True)
  assert type(back) is type(model)
  for problem in ("missing_keys", "unexpected_keys", "mismatched_keys",
                  "error_msgs"):
    assert not info[problem], (problem, info[problem])
  want, got = model.state_dict(), back.state_dict()
  assert want.keys() == got.keys()
  for key in want:
    assert want[key].dtype == got[key].dtype, key
    assert torch.equal(want[key], got[key]), key
  # The written file also matches what save_pretrained wrote, name for name.
  ours = load_file(os.path.join(tmp_path, "model.safetensors"))
  theirs = load_file(os.path.join(path, "model.safetensors"))
  assert ours.keys() == theirs.keys()
  for key in theirs:
    assert np.array_equal(ours[key], theirs[key]), key
  with open(os.path.join(tmp_path, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["architectures"] == [cls_name]


def test_albert_jax_init_to_hf_matches(tmp_path, fast_compile):
  """Params from `Albert(cfg).init` → to_hf → HF computes the same outputs."""
  cfg = ModelConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=32,
                    num_hidden_layers=4, num_attention_heads=4,
                    intermediate_size=37, num_hidden_groups=2,
                    inner_group_num=2, max_position_embeddings=MAX_POS,
                    hidden_act="gelu_new")
  ids, token_types, mask = make_inputs(2, seed=1)
  # XLA:CPU spends ~10 s optimising init's dozens of RNG calls; this test
  # needs the values, not fast init code, so compile it unoptimised.
  args = (jax.random.key(0), jnp.asarray(ids))
  init = jax.jit(albert_lib.Albert(cfg).init).lower(*args).compile(
      compiler_options=fast_compile)
  params = nn.meta.unbox(init(*args)["params"])
  # Perturb (LayerNorm and biases init to 1 / 0) with NumPy: per-shape jax
  # RNG calls would each compile.
  rng = np.random.default_rng(0)
  params = jax.tree.map(
      lambda x: np.asarray(x) + 0.1 * rng.standard_normal(x.shape, np.float32),
      params)
  pt = Pretrained(config=ml_collections.ConfigDict(cfg.to_dict()),
                  model_config=cfg, params=params, heads=("mlm", "sop"),
                  pooler=True)
  ours = pt(ids, token_types, mask)
  pt.to_hf(str(tmp_path))
  model, info = transformers.AutoModelForPreTraining.from_pretrained(
      str(tmp_path), output_loading_info=True)
  assert isinstance(model, transformers.AlbertForPreTraining)
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                   "mismatched_keys", "error_msgs")), info
  assert_parity(ours, hf_outputs(model.eval(), ids, token_types, mask), mask)
  # And albert_jax reads back exactly what it wrote.
  assert_trees_equal(load_pretrained(str(tmp_path)).params, pt.params)


# --------------------------------------------------------------------------
# 3. Other storage formats.


def test_sharded_checkpoint_loads(zoo, reference, tmp_path):
  model, _ = zoo.saved()
  model.save_pretrained(str(tmp_path), max_shard_size="20KB")
  shards = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))
  assert len(shards) > 1
  assert os.path.exists(tmp_path / "model.safetensors.index.json")
  assert not os.path.exists(tmp_path / "model.safetensors")
  assert_trees_equal(load_pretrained(str(tmp_path)).params, reference.params)
  os.remove(tmp_path / shards[-1])
  with pytest.raises(CheckpointError, match=shards[-1]):
    load_pretrained(str(tmp_path))


def test_bfloat16_checkpoint_loads(zoo, tmp_path):
  """A checkpoint saved in bfloat16 loads, as float32 of the same values."""
  model = build_hf("AlbertForPreTraining", hf_config("groups"), seed=7)
  model.to(torch.bfloat16).save_pretrained(str(tmp_path))
  pt = load_pretrained(str(tmp_path))
  word = pt.params["embeddings"]["word_embeddings"]["embedding"]
  assert word.dtype == jnp.float32
  want = model.albert.embeddings.word_embeddings.weight.detach().float()
  np.testing.assert_array_equal(np.asarray(word), want.numpy())


def test_pytorch_bin_is_read_weights_only(zoo, reference, tmp_path):
  """A torch.save'd state dict gives the same params as the safetensors.

  transformers 5 writes safetensors even with safe_serialization=False, so
  the .bin is written with torch.save. The full state dict holds the tied
  decoder copies, and older checkpoints also held the position_ids buffer.
  """
  model, path = zoo.saved()
  shutil.copy(os.path.join(path, "config.json"), tmp_path)
  state = dict(model.state_dict())
  assert "predictions.decoder.weight" in state
  state["albert.embeddings.position_ids"] = torch.arange(MAX_POS)[None]
  torch.save(state, tmp_path / "pytorch_model.bin")
  assert_trees_equal(load_pretrained(str(tmp_path)).params, reference.params)


def test_untied_decoder_is_refused(zoo, tmp_path):
  model, path = zoo.saved()
  shutil.copy(os.path.join(path, "config.json"), tmp_path)
  state = {k: v.clone() for k, v in model.state_dict().items()}
  state["predictions.decoder.weight"] += 1.0
  torch.save(state, tmp_path / "pytorch_model.bin")
  with pytest.raises(CheckpointError, match="predictions.decoder.weight"):
    load_pretrained(str(tmp_path))


# --------------------------------------------------------------------------
# 4. Safety: nothing is unpickled.

_EXECUTED = []


def _payload(tag):
  _EXECUTED.append(tag)
  return tag


class _Evil:
  """Pickles as a call to `_payload`: unpickling it would run code."""

  def __reduce__(self):
    return (_payload, ("unpickled",))


def test_safetensors_load_never_unpickles(zoo, tmp_path, monkeypatch):
  """Even with a malicious pytorch_model.bin beside model.safetensors."""
  path = zoo.copy(tmp_path)
  torch.save({"payload": _Evil()}, os.path.join(path, "pytorch_model.bin"))

  def refuse(*args, **kwargs):
    raise AssertionError("something was unpickled")

  monkeypatch.setattr(pickle, "load", refuse)
  monkeypatch.setattr(pickle, "loads", refuse)
  monkeypatch.setattr(torch, "load", refuse)
  pt = load_pretrained(path)
  assert pt.heads == ("mlm", "sop")
  assert not _EXECUTED


@pytest.mark.parametrize("content", ["object", "non_tensor", "not_a_dict"])
def test_bin_with_non_tensors_is_refused(zoo, tmp_path, content):
  """Pickled objects never run; anything but named tensors is refused."""
  model, path = zoo.saved()
  shutil.copy(os.path.join(path, "config.json"), tmp_path)
  state = dict(model.state_dict())
  if content == "object":
    state["payload"] = _Evil()
  elif content == "non_tensor":
    state["training_step"] = 3  # weights_only allows it; we do not.
  else:
    state = list(state.values())
  torch.save(state, tmp_path / "pytorch_model.bin")
  with pytest.raises(CheckpointError) as error:
    load_pretrained(str(tmp_path))
  message = str(error.value)
  assert "pytorch_model.bin" in message
  assert "safe_serialization=True" in message  # How to convert.
  if content == "object":
    assert "weights_only=True" in message
  assert not _EXECUTED


def test_bin_without_torch_says_how_to_convert(zoo, tmp_path, monkeypatch):
  model, path = zoo.saved()
  shutil.copy(os.path.join(path, "config.json"), tmp_path)
  torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
  monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails.
  with pytest.raises(CheckpointError, match="torch is not installed") as error:
    load_pretrained(str(tmp_path))
  assert "safe_serialization=True" in str(error.value)


# --------------------------------------------------------------------------
# 5. Broken checkpoints give errors that say what is wrong.


@pytest.mark.parametrize("damage", ["truncated_tail", "truncated_half",
                                    "garbage", "empty"])
def test_corrupt_safetensors(zoo, tmp_path, damage):
  path = zoo.copy(tmp_path)
  file = os.path.join(path, "model.safetensors")
  with open(file, "rb") as f:
    data = f.read()
  data = {"truncated_tail": data[:-64], "truncated_half": data[:len(data) // 2],
          "garbage": b"\x00not a safetensors file" * 10, "empty": b""}[damage]
  with open(file, "wb") as f:
    f.write(data)
  with pytest.raises(CheckpointError, match="corrupt") as error:
    load_pretrained(path)
  assert file in str(error.value)


def test_missing_config(zoo, tmp_path):
  path = zoo.copy(tmp_path)
  os.remove(os.path.join(path, "config.json"))
  with pytest.raises(CheckpointError, match="no config.json"):
    load_pretrained(path)


def test_missing_weights(zoo, tmp_path):
  path = zoo.copy(tmp_path)
  os.remove(os.path.join(path, "model.safetensors"))
  with pytest.raises(CheckpointError, match="No weights"):
    load_pretrained(path)


def test_not_a_directory(tmp_path):
  with pytest.raises(CheckpointError, match="not a directory"):
    load_pretrained(str(tmp_path / "nowhere"))


def _edit_config(path, **changes):
  file = os.path.join(path, "config.json")
  with open(file, encoding="utf-8") as f:
    config = json.load(f)
  config.update(changes)
  with open(file, "w", encoding="utf-8") as f:
    json.dump(config, f)


@pytest.mark.parametrize("changes, expected", [
    (dict(model_type="gpt2"),
     "model_type='gpt2'; albert_jax reads checkpoints of model types "
     "albert, bert, electra, roberta"),
    (dict(position_embedding_type="relative_key"), "relative_key"),
    (dict(hidden_act="swishy"), "swishy"),
    (dict(num_attention_heads=5), "divisible"),
    # ALBERT's shared layers leave the depth out of every tensor's shape,
    # so only the bound stops it (a forward's time grew with it).
    (dict(num_hidden_layers=10**6), "model.num_hidden_layers=1000000 is "
     r"more than albert_jax builds \(at most 1024\)"),
])
def test_bad_config(zoo, tmp_path, changes, expected):
  path = zoo.copy(tmp_path)
  _edit_config(path, **changes)
  with pytest.raises(CheckpointError, match=expected) as error:
    load_pretrained(path)
  assert "config.json" in str(error.value)


def test_config_defaults_follow_transformers():
  """Keys a config.json omits take AlbertConfig's defaults, not ours; a
  config from before `model_type` existed is recognised by its class."""
  cfg = hf_config_lib.config_from_hf({"architectures": ["AlbertForMaskedLM"],
                           "classifier_dropout_prob": None})
  reference = transformers.AlbertConfig()
  for key in CONFIG_KEYS["albert"]:
    assert getattr(cfg, key) == getattr(reference, key), key


def test_v1_gelu_runs_as_transformers_runs_it():
  """HF's v1 configs say "gelu", which transformers runs as the erf form
  (the official TF code's "gelu" is the tanh form, up to 4.7e-4 away): an HF
  v1 checkpoint runs erf here too, for parity with transformers."""
  cfg = hf_config_lib.config_from_hf({"model_type": "albert", "hidden_act": "gelu",
                           "hidden_dropout_prob": 0.1,
                           "attention_probs_dropout_prob": 0.1})
  assert cfg.hidden_act == "gelu"
  x = np.linspace(-6.0, 6.0, 1201, dtype=np.float32)
  ours = np.asarray(layers.activation(cfg.hidden_act)(x))
  act = transformers.activations.ACT2FN
  theirs = act["gelu"](torch.from_numpy(x)).numpy()
  np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)
  tanh = act["gelu_new"](torch.from_numpy(x)).numpy()
  assert np.max(np.abs(tanh - theirs)) > 4e-4


def test_config_not_json(zoo, tmp_path):
  path = zoo.copy(tmp_path)
  with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
    f.write("{not json")
  with pytest.raises(CheckpointError, match="not valid JSON"):
    load_pretrained(path)


LAYER = "albert.encoder.albert_layer_groups.{}.albert_layers.{}."


@pytest.mark.parametrize("changes, expected", [
    # Every tensor of width H is listed with both shapes, in model order
    # (60 here, so the tail is counted rather than shown).
    (dict(hidden_size=48), [
        "albert.encoder.embedding_hidden_mapping_in.weight: checkpoint "
        "(32, 16), config expects (48, 16)",
        LAYER.format(0, 1) + "ffn.weight: checkpoint (37, 32), config "
        "expects (37, 48)",
        "... and 26 more"]),
    (dict(hidden_size=48, num_attention_heads=3), [
        LAYER.format(0, 0) + "attention.query.weight: checkpoint (32, 32), "
        "config expects (48, 48)"]),
    (dict(num_hidden_groups=1), [
        LAYER.format(1, 0) + "attention.query.weight: unexpected (32, 32)",
        LAYER.format(1, 1) + "full_layer_layer_norm.bias: unexpected (32,)"]),
    (dict(num_hidden_groups=3), [
        LAYER.format(2, 0) + "ffn_output.weight: missing (config expects "
        "(32, 37))"]),
    (dict(inner_group_num=1), [
        LAYER.format(0, 1) + "attention.dense.bias: unexpected (32,)"]),
    (dict(vocab_size=70), [
        "albert.embeddings.word_embeddings.weight: checkpoint (67, 16), "
        "config expects (70, 16)",
        "predictions.bias: checkpoint (67,), config expects (70,)"]),
])
def test_config_disagreeing_with_weights(zoo, tmp_path, changes, expected):
  """Edited shape fields: one error listing every mismatched tensor."""
  path = zoo.copy(tmp_path)
  _edit_config(path, **changes)
  with pytest.raises(CheckpointError, match="mismatched tensors") as error:
    load_pretrained(path)
  message = str(error.value)
  for line in expected:
    assert line in message, message
  for key, value in changes.items():
    assert f"{key}={value}" in message


def test_override_disagreeing_with_weights(zoo):
  with pytest.raises(CheckpointError, match="max_position_embeddings=32"):
    load_pretrained(zoo.saved()[1], max_position_embeddings=32)


@pytest.mark.parametrize("name", ["../outside/x.safetensors",
                                  "/tmp/x.safetensors", "sub/x.safetensors",
                                  ".."])
def test_an_index_naming_shards_outside_its_directory_is_refused(tmp_path,
                                                                name):
  """Even when the named file exists and holds valid tensors."""
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top
  from albert_jax.interop import hf_files  # pylint: disable=g-import-not-at-top
  (tmp_path / "outside").mkdir()
  st_numpy.save_file({"w": np.ones(2, np.float32)},
                     str(tmp_path / "outside" / "x.safetensors"))
  model = tmp_path / "model"
  model.mkdir()
  index = model / "model.safetensors.index.json"
  index.write_text(json.dumps({"weight_map": {"w": name}}))
  with pytest.raises(CheckpointError) as e:
    hf_files.read_state_dict(str(model))
  assert str(e.value) == (
      f"{index} names shard(s) [{name!r}] that are not file names in "
      f"{model}; a sharded checkpoint's shards sit beside its index, and "
      "albert_jax reads nothing outside the checkpoint directory. Fix the "
      "index's weight_map, or re-download the checkpoint.")
