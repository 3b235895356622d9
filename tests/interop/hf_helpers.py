"""Tiny transformers reference models and the parity checks against them,
shared by test_hf_interop (ALBERT) and test_hf_family (BERT, RoBERTa,
ELECTRA).

Every reference model is randomly initialised with every parameter then
perturbed, so LayerNorm scales and biases (which HF initialises to 1 / 0)
are exercised too. Comparisons are float32 on CPU and only at real (not
padding) positions: HF lets a padded query row attend to the real tokens,
while albert_jax returns a zero context for it; padded keys are masked
identically and rows never mix outside attention, so every real position
must agree. Pooled output and sentence logits read position 0.
"""

import os
import shutil

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Compared outputs at most this far from HF (max abs).
TOLERANCE = {"sequence_output": 1e-5, "pooled_output": 1e-5,
             "mlm_logits": 1e-4, "sop_logits": 1e-4, "rtd_logits": 1e-4}
# Outputs read at position 0 (one row per sequence).
_FIRST_POSITION = ("pooled_output", "sop_logits")


def build_hf(cls_name, config, seed):
  """A random-init transformers `cls_name` model with every parameter
  perturbed by 0.1 N(0, 1)."""
  torch.manual_seed(seed)
  model = getattr(transformers, cls_name)(config).eval()
  with torch.no_grad():
    for p in model.parameters():  # Tied tensors are one Parameter: stay tied.
      p.add_(0.1 * torch.randn_like(p))
  return model


def hf_outputs(model, ids, token_types=None, mask=None):
  """HF outputs under albert_jax's names, as NumPy.

  Args:
    model: a transformers model: a base model, or one with heads.
    ids: [B, T] token ids.
    token_types: [B, T] or None (HF's default, all zeros).
    mask: [B, T] attention mask or None (no padding).
  """
  kw = {"input_ids": torch.as_tensor(ids)}
  if token_types is not None:
    kw["token_type_ids"] = torch.as_tensor(token_types)
  if mask is not None:
    kw["attention_mask"] = torch.as_tensor(mask)
  base = getattr(model, model.base_model_prefix, model)
  with torch.no_grad():
    b = base(**kw)
    out = {"sequence_output": b.last_hidden_state.numpy()}
    if getattr(b, "pooler_output", None) is not None:
      out["pooled_output"] = b.pooler_output.numpy()
    if base is model:
      return out
    full = model(**kw)
  if isinstance(model, transformers.AlbertForPreTraining):
    out["mlm_logits"] = full.prediction_logits.numpy()
    out["sop_logits"] = full.sop_logits.numpy()
  elif isinstance(model, transformers.BertForPreTraining):
    out["mlm_logits"] = full.prediction_logits.numpy()
    out["sop_logits"] = full.seq_relationship_logits.numpy()
  elif isinstance(model, transformers.ElectraForPreTraining):
    out["rtd_logits"] = full.logits.numpy()
  elif "MaskedLM" in type(model).__name__:
    out["mlm_logits"] = full.logits.numpy()
  return out


def assert_parity(ours, ref, mask=None):
  """Same output names; each within TOLERANCE at the real positions (all of
  them when `mask` is None)."""
  assert set(ours) == set(ref)
  keep = (np.ones(ref["sequence_output"].shape[:2], bool) if mask is None
          else np.asarray(mask, bool))
  for name, want in ref.items():
    got = np.asarray(ours[name], np.float32)
    rows = keep[:, 0] if name in _FIRST_POSITION else keep
    got, want = got[rows], want[rows]
    assert got.shape == want.shape, name
    np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE[name],
                               err_msg=name)


def assert_trees_equal(a, b):
  """Same tree structure; every leaf the same dtype and bitwise equal."""
  fa, ta = jax.tree.flatten_with_path(a)
  fb, tb = jax.tree.flatten_with_path(b)
  assert ta == tb
  for (path, x), (_, y) in zip(fa, fb):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and np.array_equal(x, y), jax.tree_util.keystr(
        path)


class Zoo:
  """Saved HF checkpoints, built once per (case, class) for a test module.

  `hf_config(case)` is a case's transformers config; `saved` and `copy`
  without arguments mean `default`, a (case, class name) pair.
  """

  def __init__(self, root, hf_config, default=(None, None)):
    self.root, self.hf_config, self.default = root, hf_config, default
    self._saved = {}

  def saved(self, case=None, cls_name=None):
    """(HF model, its save_pretrained directory)."""
    key = (case or self.default[0], cls_name or self.default[1])
    if key not in self._saved:
      model = build_hf(key[1], self.hf_config(key[0]), seed=len(self._saved))
      path = os.path.join(self.root, f"{key[0]}-{key[1]}")
      model.save_pretrained(path)
      self._saved[key] = (model, path)
    return self._saved[key]

  def copy(self, dest, case=None, cls_name=None):
    """A writable copy of a saved checkpoint directory at `dest`."""
    _, path = self.saved(case, cls_name)
    shutil.copytree(path, dest, dirs_exist_ok=True)
    return str(dest)
