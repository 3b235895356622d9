"""Official google-research/albert TF1 release directories.

Each release directory here is written by the test itself: the weights of a
tiny random transformers ALBERT, renamed by hand to the official variable
names and layouts (TF kernels [in, out]; `cls/seq_relationship/output_weights`
[2, H]) following HF's conversion table, saved with tf.compat.v1 variables and
a v1 Saver, beside LAMB's `adam_m` / `adam_v` slots and `global_step`, an
`albert_config.json` with the official keys and a SentencePiece model. The
TF-loaded model must equal the same weights loaded through the HF path.
"""

import json
import logging
import os
import shutil
import subprocess
import sys

from locations import T5_SPM
import numpy as np
import pytest

from albert_jax.interop import tf_checkpoint
from albert_jax.interop import CheckpointError
from albert_jax.model import layers
from albert_jax.interop.pretrained import load_pretrained

tf = pytest.importorskip("tensorflow")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

transformers.logging.set_verbosity_error()

SPM = str(T5_SPM)
VOCAB, MAX_POS = 41, 16
# Two groups over three layers with two inner blocks each; HF's gelu_new is
# the official "gelu".
SHAPE = dict(embedding_size=8, hidden_size=16, num_attention_heads=2,
             intermediate_size=22, num_hidden_layers=3, num_hidden_groups=2,
             inner_group_num=2)
STEP = 4321


def official_config(**changes):
  """albert_config.json as the releases write it."""
  config = dict(vocab_size=VOCAB, max_position_embeddings=MAX_POS,
                type_vocab_size=2, hidden_act="gelu", hidden_dropout_prob=0,
                attention_probs_dropout_prob=0, initializer_range=0.02,
                net_structure_type=0, gap_size=0, num_memory_blocks=0,
                down_scale_factor=1, **SHAPE)
  config.update(changes)
  return config


def build_hf(seed=0, **changes):
  """A perturbed random AlbertForPreTraining of `official_config` shape."""
  shape = {**SHAPE, **changes}
  config = transformers.AlbertConfig(
      vocab_size=VOCAB, max_position_embeddings=MAX_POS, hidden_act="gelu_new",
      **shape)
  torch.manual_seed(seed)
  model = transformers.AlbertForPreTraining(config).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.1 * torch.randn_like(p))
  return model


def official_variables(model):
  """The HF weights under the official TF names and layouts."""
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  cfg = model.config
  out = {}

  def dense(tf_name, hf_name):
    out[tf_name + "/kernel"] = sd[hf_name + ".weight"].T
    out[tf_name + "/bias"] = sd[hf_name + ".bias"]

  def norm(tf_name, hf_name):
    out[tf_name + "/gamma"] = sd[hf_name + ".weight"]
    out[tf_name + "/beta"] = sd[hf_name + ".bias"]

  for name in ("word", "position", "token_type"):
    out[f"bert/embeddings/{name}_embeddings"] = sd[
        f"albert.embeddings.{name}_embeddings.weight"]
  norm("bert/embeddings/LayerNorm", "albert.embeddings.LayerNorm")
  if cfg.embedding_size != cfg.hidden_size:
    dense("bert/encoder/embedding_hidden_mapping_in",
          "albert.encoder.embedding_hidden_mapping_in")
  for g in range(cfg.num_hidden_groups):
    for i in range(cfg.inner_group_num):
      t = f"bert/encoder/transformer/group_{g}/inner_group_{i}/"
      h = f"albert.encoder.albert_layer_groups.{g}.albert_layers.{i}."
      for name in ("query", "key", "value"):
        dense(t + f"attention_1/self/{name}", h + f"attention.{name}")
      dense(t + "attention_1/output/dense", h + "attention.dense")
      norm(t + "LayerNorm", h + "attention.LayerNorm")
      dense(t + "ffn_1/intermediate/dense", h + "ffn")
      dense(t + "ffn_1/intermediate/output/dense", h + "ffn_output")
      norm(t + "LayerNorm_1", h + "full_layer_layer_norm")
  dense("bert/pooler/dense", "albert.pooler")
  dense("cls/predictions/transform/dense", "predictions.dense")
  norm("cls/predictions/transform/LayerNorm", "predictions.LayerNorm")
  out["cls/predictions/output_bias"] = sd["predictions.bias"]
  out["cls/seq_relationship/output_weights"] = sd[
      "sop_classifier.classifier.weight"]
  out["cls/seq_relationship/output_bias"] = sd["sop_classifier.classifier.bias"]
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def with_optimizer_state(variables, step=STEP):
  """Adds LAMB's slots for every weight, and global_step."""
  rng = np.random.default_rng(1)
  out = dict(variables)
  for name, value in variables.items():
    for slot in ("adam_m", "adam_v"):
      out[f"{name}/{slot}"] = rng.standard_normal(value.shape).astype(
          np.float32)
  out["global_step"] = np.int64(step)
  return out


def write_release(path, variables, config, step=STEP):
  """A release directory: albert_config.json, model.ckpt-STEP, spm model."""
  os.makedirs(path, exist_ok=True)
  graph = tf.Graph()
  with graph.as_default():
    tf_vars = {name: tf.compat.v1.Variable(value, name=name)
               for name, value in variables.items()}
    saver = tf.compat.v1.train.Saver(var_list=tf_vars)
    with tf.compat.v1.Session(graph=graph) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      saver.save(sess, os.path.join(path, "model.ckpt"), global_step=step,
                 write_meta_graph=False)
  with open(os.path.join(path, tf_checkpoint.CONFIG_FILE), "w",
            encoding="utf-8") as f:
    json.dump(config, f)
  shutil.copy(SPM, os.path.join(path, "30k-clean.model"))
  return str(path)


def inputs(seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, VOCAB, (3, 10))
  types = rng.integers(0, 2, (3, 10))
  mask = np.ones((3, 10), np.int64)
  mask[1, 6:] = 0
  mask[2, 2:] = 0
  return ids, types, mask


def assert_trees_equal(a, b):
  import jax  # pylint: disable=g-import-not-at-top
  fa, ta = jax.tree.flatten_with_path(a)
  fb, tb = jax.tree.flatten_with_path(b)
  assert ta == tb
  for (path, x), (_, y) in zip(fa, fb):
    assert np.array_equal(np.asarray(x), np.asarray(y)), path


@pytest.fixture(scope="module")
def release(tmp_path_factory):
  """(HF model, its HF directory, the official release directory)."""
  model = build_hf()
  root = tmp_path_factory.mktemp("albert_release")
  model.save_pretrained(str(root / "hf"))
  variables = with_optimizer_state(official_variables(model))
  return model, str(root / "hf"), write_release(root / "release", variables,
                                                official_config())


def test_release_equals_the_hf_path(release):
  """Same parameters, bit for bit; outputs within 1e-5 of the HF path's and
  of transformers' own at every real token."""
  model, hf_dir, release_dir = release
  from_tf = load_pretrained(release_dir)
  from_hf = load_pretrained(hf_dir)
  assert from_tf.heads == ("mlm", "sop") and from_tf.pooler
  assert from_tf.missing == () and from_tf.step == STEP
  assert from_tf.model_type == "albert"
  assert from_tf.model_config == from_hf.model_config
  assert_trees_equal(from_tf.params, from_hf.params)
  ids, types, mask = inputs()
  ours, theirs = from_tf(ids, types, mask), from_hf(ids, types, mask)
  keep = mask.astype(bool)
  with torch.no_grad():
    kw = dict(input_ids=torch.as_tensor(ids),
              token_type_ids=torch.as_tensor(types),
              attention_mask=torch.as_tensor(mask))
    torch_seq = model.albert(**kw).last_hidden_state.numpy()
    torch_sop = model(**kw).sop_logits.numpy()
  for name in ours:
    got, want = np.asarray(ours[name]), np.asarray(theirs[name])
    if name in ("sequence_output", "mlm_logits"):
      got, want = got[keep], want[keep]
    assert np.abs(got - want).max() <= 1e-5, name
  seq = np.asarray(ours["sequence_output"])[keep]
  assert np.abs(seq - torch_seq[keep]).max() <= 1e-5
  assert np.abs(np.asarray(ours["sop_logits"]) - torch_sop).max() <= 1e-4
  assert from_tf.tokenizer.path.endswith("30k-clean.model")


def test_equal_embedding_and_hidden_size_has_no_projection(tmp_path):
  """With E == H the official model has no embedding_hidden_mapping_in; HF
  always has one, which is the identity here."""
  model = build_hf(seed=2, embedding_size=16)
  with torch.no_grad():
    mapping = model.albert.encoder.embedding_hidden_mapping_in
    mapping.weight.copy_(torch.eye(16))
    mapping.bias.zero_()
  variables = official_variables(model)
  assert not any("embedding_hidden_mapping_in" in k for k in variables)
  pt = load_pretrained(write_release(tmp_path, variables,
                                     official_config(embedding_size=16)))
  assert not pt.model_config.embedding_projection
  ids, types, mask = inputs(1)
  with torch.no_grad():
    want = model.albert(input_ids=torch.as_tensor(ids),
                        token_type_ids=torch.as_tensor(types),
                        attention_mask=torch.as_tensor(mask)
                        ).last_hidden_state.numpy()
  keep = mask.astype(bool)
  got = np.asarray(pt(ids, types, mask)["sequence_output"])
  assert np.abs(got[keep] - want[keep]).max() <= 1e-5


def test_latest_or_chosen_step(release, tmp_path):
  """The newest model.ckpt-N unless `step` picks one; `.step` is its
  global_step."""
  variables = official_variables(release[0])
  name = "cls/predictions/output_bias"
  changed = {**variables, name: variables[name] + np.float32(1.0)}
  for step, weights in ((5, variables), (7, changed)):
    path = write_release(tmp_path, {**weights, "global_step": np.int64(step)},
                         official_config(), step=step)
  newest, older = load_pretrained(path), load_pretrained(path, step=5)
  assert (newest.step, older.step) == (7, 5)
  np.testing.assert_array_equal(newest.params["mlm"]["output_bias"],
                                changed[name])
  np.testing.assert_array_equal(older.params["mlm"]["output_bias"],
                                variables[name])
  with pytest.raises(CheckpointError, match=r"no checkpoint model.ckpt-9; it "
                     r"holds \['model.ckpt-5', 'model.ckpt-7'\]"):
    load_pretrained(path, step=9)


# --------------------------------------------------------------------------
# Errors name what is wrong.

GROUP = "bert/encoder/transformer/group_{}/inner_group_{}/"


@pytest.mark.parametrize("edit, config, expected", [
    (lambda v: v.pop(GROUP.format(1, 0) + "LayerNorm_1/gamma"), {},
     GROUP.format(1, 0) + "LayerNorm_1/gamma: missing (config expects (16,))"),
    (lambda v: v.update({GROUP.format(2, 0) + "LayerNorm/beta":
                         np.zeros(16, np.float32)}), {},
     GROUP.format(2, 0) + "LayerNorm/beta: unexpected (16,) (config has no "
     "place for it)"),
    (lambda v: None, dict(intermediate_size=24),
     GROUP.format(0, 1) + "ffn_1/intermediate/dense/kernel: checkpoint "
     "(16, 22), config expects (16, 24)"),
], ids=["missing", "unexpected", "wrong_shape"])
def test_wrong_variable_is_named(release, tmp_path, edit, config, expected):
  variables = official_variables(release[0])
  edit(variables)
  path = write_release(tmp_path, variables, official_config(**config))
  with pytest.raises(CheckpointError, match="do not fit albert_config.json"
                     ) as error:
    load_pretrained(path)
  assert expected in str(error.value)


def test_fine_tuning_variables_are_left_out_with_a_warning(release, tmp_path,
                                                           caplog):
  variables = official_variables(release[0])
  variables["output_weights"] = np.zeros((3, 16), np.float32)
  path = write_release(tmp_path, variables, official_config())
  with caplog.at_level(logging.WARNING):
    pt = load_pretrained(path)
  assert "output_weights" in caplog.text
  assert pt.heads == ("mlm", "sop")


@pytest.mark.parametrize("changes, expected", [
    (dict(hidden_act="linear"), "hidden_act='linear'"),
    (dict(layer_norm_epsilon=1e-6), "unknown keys ['layer_norm_epsilon']"),
    (dict(num_hidden_layers=22, num_hidden_groups=22),
     "assigns layers to groups"),
    # Refused from the config alone, before any variable is read (it
    # allocated 1.5 GB before its error).
    (dict(num_hidden_layers=10**6),
     "model.num_hidden_layers=1000000 is more than albert_jax builds"),
], ids=["activation", "unknown_key", "group_rounding", "huge_depth"])
def test_bad_official_config(changes, expected):
  with pytest.raises(ValueError) as error:
    tf_checkpoint.config_from_tf(official_config(**changes))
  assert expected in str(error.value)


def test_official_gelu_is_the_tanh_form():
  """A release's "gelu" runs as the official modeling.py's gelu(), the form
  its weights were trained with: x * 0.5 * (1 + tanh(sqrt(2 / pi) * (x +
  0.044715 * x^3))), not the erf form (up to 4.7e-4 away)."""
  for config in (official_config(), official_config(
      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)):  # v1
    assert tf_checkpoint.config_from_tf(config).hidden_act == "gelu_new"
  x = np.linspace(-6.0, 6.0, 1201, dtype=np.float32)
  ours = np.asarray(layers.activation("gelu_new")(x))
  official = x * 0.5 * (1.0 + np.tanh(
      np.sqrt(2 / np.pi) * (x + 0.044715 * np.power(x, 3))))
  np.testing.assert_allclose(ours, official, rtol=0, atol=1e-6)
  erf = np.asarray(layers.activation("gelu")(x))
  assert np.max(np.abs(erf - official)) > 4e-4


def test_without_tensorflow_says_what_to_install(release, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow", None)  # import fails
  with pytest.raises(CheckpointError, match=r"pip install 'albert_jax\[tf\]'"):
    load_pretrained(release[2])


def test_no_checkpoint_files(tmp_path):
  with open(tmp_path / tf_checkpoint.CONFIG_FILE, "w", encoding="utf-8") as f:
    json.dump(official_config(), f)
  with pytest.raises(CheckpointError, match="no TF checkpoint"):
    load_pretrained(str(tmp_path))


def test_tensorflow_is_imported_only_for_tf_checkpoints():
  code = ("import sys, albert_jax.interop.pretrained, albert_jax.interop.hf; "
          "assert 'tensorflow' not in sys.modules")
  subprocess.run([sys.executable, "-c", code], check=True,
                 env={**os.environ, "JAX_PLATFORMS": "cpu"})
