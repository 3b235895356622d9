"""albert_jax ↔ HF transformers BERT, RoBERTa and ELECTRA.

Reference models are tiny, randomly initialised transformers models built
here, every parameter perturbed so LayerNorms and biases count (the builder
and the parity checks are tests/interop/hf_helpers.py's, shared with
test_hf_interop). All
comparisons are float32 on CPU, at non-padding positions only: HF lets a
padded query row attend to the real tokens, while albert_jax returns a zero
context for it; padded keys are masked identically and rows never mix outside
attention, so every real position must agree.

Activations are chosen so a wrong head activation shows: RoBERTa's LM head and
ELECTRA's generator head hard-code erf GELU whatever `hidden_act` is, while
BERT's MLM head and ELECTRA's discriminator follow `hidden_act` (ReLU here).
"""

import json
import os

from hf_helpers import assert_parity
from hf_helpers import assert_trees_equal
from hf_helpers import hf_outputs
from hf_helpers import Zoo
import jax
import ml_collections
import numpy as np
import pytest
from safetensors.numpy import load_file

from albert_jax.interop import CheckpointError
from albert_jax.interop.pretrained import load_pretrained
from albert_jax.interop.pretrained import Pretrained
from albert_jax.model import albert as albert_lib
from albert_jax.model import encoder
from albert_jax.model.config import ModelConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

VOCAB, MAX_POS = 53, 20
BATCH, LENGTH = 3, 9
ROBERTA_PAD = 1

CONFIGS = {
    "bert": dict(hidden_size=24, num_attention_heads=3, intermediate_size=31,
                 num_hidden_layers=2, hidden_act="relu", type_vocab_size=2,
                 max_position_embeddings=MAX_POS),
    # RoBERTa's shape: one token type, positions offset past the pad id.
    "roberta": dict(hidden_size=16, num_attention_heads=2,
                    intermediate_size=27, num_hidden_layers=2,
                    hidden_act="relu", type_vocab_size=1,
                    pad_token_id=ROBERTA_PAD, layer_norm_eps=1e-5,
                    max_position_embeddings=MAX_POS + ROBERTA_PAD + 1),
    # E != H: the embeddings_project layer exists.
    "electra": dict(embedding_size=12, hidden_size=24, num_attention_heads=4,
                    intermediate_size=30, num_hidden_layers=3,
                    hidden_act="relu", max_position_embeddings=MAX_POS),
    # E == H: no projection.
    "electra_flat": dict(embedding_size=16, hidden_size=16,
                         num_attention_heads=2, intermediate_size=20,
                         num_hidden_layers=2, hidden_act="gelu_new",
                         max_position_embeddings=MAX_POS),
}
CONFIG_CLASS = {"bert": "BertConfig", "roberta": "RobertaConfig",
                "electra": "ElectraConfig", "electra_flat": "ElectraConfig"}
AUTO_CLASS = {
    "BertForPreTraining": "AutoModelForPreTraining",
    "BertForMaskedLM": "AutoModelForMaskedLM",
    "BertForNextSentencePrediction": "AutoModelForNextSentencePrediction",
    "BertModel": "AutoModel",
    "RobertaForMaskedLM": "AutoModelForMaskedLM",
    "RobertaModel": "AutoModel",
    "ElectraForPreTraining": "AutoModelForPreTraining",
    "ElectraForMaskedLM": "AutoModelForMaskedLM",
    "ElectraModel": "AutoModel",
}


def family(case):
  return "electra" if case.startswith("electra") else case


def hf_config(case):
  return getattr(transformers, CONFIG_CLASS[case])(vocab_size=VOCAB,
                                                   **CONFIGS[case])


def make_inputs(case, seed=0):
  """[B, T] ids, token types and mask: right, no and (RoBERTa) left padding.

  RoBERTa's row 0 also holds a real token equal to the pad id, which HF's
  positions skip although attention sees it.
  """
  rng = np.random.default_rng(seed)
  pad = ROBERTA_PAD if case == "roberta" else 0
  ids = rng.integers(2, VOCAB, (BATCH, LENGTH))
  mask = np.ones((BATCH, LENGTH), np.int64)
  mask[1, 6:] = 0
  if case == "roberta":
    mask[2, :3] = 0
    ids[0, 4] = pad
  else:
    mask[2, 3:] = 0
  ids[mask == 0] = pad
  types = rng.integers(0, CONFIGS[case].get("type_vocab_size", 2),
                       (BATCH, LENGTH))
  return ids, types, mask


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
  return Zoo(str(tmp_path_factory.mktemp("hf_family")), hf_config)


# --------------------------------------------------------------------------
# 1. Numerical parity.

PARITY = [
    ("bert", "BertForPreTraining", ("mlm", "sop"), True, ()),
    ("roberta", "RobertaForMaskedLM", ("mlm",), False, ("pooler",)),
    ("roberta", "RobertaModel", (), True, ("mlm",)),
    ("electra", "ElectraForPreTraining", ("rtd",), False, ("mlm",)),
    ("electra_flat", "ElectraForMaskedLM", ("mlm",), False, ("rtd",)),
]


@pytest.mark.parametrize("case, cls_name, heads, pooler, missing", PARITY,
                         ids=[p[1] for p in PARITY])
def test_parity(zoo, case, cls_name, heads, pooler, missing):
  model, path = zoo.saved(case, cls_name)
  pt = load_pretrained(path)
  assert (pt.heads, pt.pooler, pt.missing) == (heads, pooler, missing)
  assert pt.model_type == family(case)
  ids, types, mask = make_inputs(case)
  assert_parity(pt(ids, types, mask), hf_outputs(model, ids, types, mask),
                mask)


def test_config_mapping(zoo):
  """Family structure comes from config.json, not from ModelConfig defaults."""
  expected = {
      "bert": dict(share="none", embedding_projection=False,
                   embedding_size=24, mlm_activation="relu",
                   position_ids_from_padding=False),
      "roberta": dict(share="none", embedding_projection=False,
                      type_vocab_size=1, pad_token_id=ROBERTA_PAD,
                      layer_norm_eps=1e-5, mlm_activation="gelu",
                      position_ids_from_padding=True,
                      max_position_embeddings=MAX_POS + 2),
      "electra": dict(share="none", embedding_projection=True,
                      embedding_size=12, mlm_activation="gelu"),
      "electra_flat": dict(embedding_projection=False, embedding_size=16),
  }
  for case, fields in expected.items():
    cls_name = {"bert": "BertModel", "roberta": "RobertaModel"}.get(
        case, "ElectraModel")
    cfg = load_pretrained(zoo.saved(case, cls_name)[1]).model_config
    for name, value in fields.items():
      assert getattr(cfg, name) == value, (case, name)


def test_base_models_hold_the_same_weights_as_the_full_ones(zoo, tmp_path):
  """BertModel / ElectraModel without a prefix: the pre-training model's
  encoder (whose outputs are checked above), tensor for tensor."""
  for case, cls_name, base_cls in (
      ("bert", "BertForPreTraining", "BertModel"),
      ("electra", "ElectraForPreTraining", "ElectraModel")):
    model, path = zoo.saved(case, cls_name)
    base_dir = str(tmp_path / base_cls)
    model.base_model.save_pretrained(base_dir)
    keys = load_file(os.path.join(base_dir, "model.safetensors"))
    assert not any(k.startswith(family(case) + ".") for k in keys)
    full, base = load_pretrained(path), load_pretrained(base_dir)
    assert base.heads == ()
    want = {k: v for k, v in full.params.items()
            if k in ("embeddings", "encoder", "pooler")}
    assert_trees_equal(base.params, want)


def test_roberta_positions_follow_the_padding():
  """Exact values: left, right and inner pad tokens (pad id 1)."""
  ids = np.asarray([[1, 1, 7, 8, 9], [7, 8, 9, 1, 1], [7, 1, 8, 1, 9]])
  want = [[1, 1, 2, 3, 4], [2, 3, 4, 1, 1], [2, 1, 3, 1, 4]]
  cfg = ModelConfig(position_ids_from_padding=True, pad_token_id=1)
  got = encoder.position_ids(cfg, jax.numpy.asarray(ids))
  np.testing.assert_array_equal(np.asarray(got), want)
  # From a mask marking the same tokens real: the same positions.
  got = encoder.position_ids(cfg, jax.numpy.asarray(ids),
                             jax.numpy.asarray(ids != 1))
  np.testing.assert_array_equal(np.asarray(got), want)


def test_roberta_length_limit_accounts_for_the_offset(zoo):
  """Positions start at pad + 1, so MAX_POS + 2 positions hold MAX_POS."""
  pt = load_pretrained(zoo.saved("roberta", "RobertaModel")[1])
  assert pt.model_config.max_length == MAX_POS
  with pytest.raises(ValueError, match=f"exceeds {MAX_POS}: positions from "
                     "padding start at pad_token_id \\+ 1 = 2"):
    pt.module.init(jax.random.key(0),
                   jax.numpy.zeros((1, MAX_POS + 1), jax.numpy.int32))


# --------------------------------------------------------------------------
# 2. Exact round trips.

ROUND_TRIP = [
    ("bert", "BertForPreTraining"), ("bert", "BertForMaskedLM"),
    ("bert", "BertForNextSentencePrediction"), ("bert", "BertModel"),
    ("roberta", "RobertaForMaskedLM"), ("roberta", "RobertaModel"),
    ("electra", "ElectraForPreTraining"), ("electra", "ElectraForMaskedLM"),
    ("electra_flat", "ElectraModel"),
]


@pytest.mark.parametrize("case, cls_name", ROUND_TRIP,
                         ids=[f"{c}-{n}" for c, n in ROUND_TRIP])
def test_round_trip_is_exact(zoo, tmp_path, case, cls_name):
  """HF → albert_jax → HF gives the same class and bits; albert_jax reads
  back exactly the parameters it wrote."""
  model, path = zoo.saved(case, cls_name)
  pt = load_pretrained(path)
  out = str(tmp_path / "out")
  pt.to_hf(out)
  auto = getattr(transformers, AUTO_CLASS[cls_name])
  back, info = auto.from_pretrained(out, output_loading_info=True)
  assert type(back) is type(model)
  for problem in ("missing_keys", "unexpected_keys", "mismatched_keys",
                  "error_msgs"):
    assert not info[problem], (problem, info[problem])
  want, got = model.state_dict(), back.state_dict()
  assert want.keys() == got.keys()
  for key in want:
    assert torch.equal(want[key], got[key]), key
  ours = load_file(os.path.join(out, "model.safetensors"))
  theirs = load_file(os.path.join(path, "model.safetensors"))
  assert ours.keys() == theirs.keys()
  for key in theirs:
    assert np.array_equal(ours[key], theirs[key]), key
  assert_trees_equal(load_pretrained(out).params, pt.params)


def random_params(cfg, heads, pooler, seed=0):
  """Parameters of `Albert(cfg)` drawn with NumPy (no init to compile)."""
  shapes = albert_lib.abstract_params(cfg, pooler, heads)
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda s: (0.3 * rng.standard_normal(s.shape)).astype(np.float32),
      shapes)


def test_albert_jax_bert_exports_as_bert(tmp_path):
  """A share="none" albert_jax model → BertForPreTraining with its outputs;
  reading it back gives the same parameters, bit for bit."""
  cfg = ModelConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=16,
                    num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=23, max_position_embeddings=MAX_POS,
                    share="none", embedding_projection=False,
                    hidden_act="gelu")
  params = random_params(cfg, ("mlm", "sop"), True)
  pt = Pretrained(config=ml_collections.ConfigDict(cfg.to_dict()),
                  model_config=cfg, params=params, heads=("mlm", "sop"))
  pt.to_hf(str(tmp_path))
  with open(tmp_path / "config.json", encoding="utf-8") as f:
    assert json.load(f)["architectures"] == ["BertForPreTraining"]
  model, info = transformers.AutoModelForPreTraining.from_pretrained(
      str(tmp_path), output_loading_info=True)
  assert isinstance(model, transformers.BertForPreTraining)
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                   "mismatched_keys")), info
  ids, types, mask = make_inputs("bert")
  assert_parity(pt(ids, types, mask), hf_outputs(model.eval(), ids, types,
                                                 mask), mask)
  again = load_pretrained(str(tmp_path))
  assert again.model_type == "bert"
  assert_trees_equal(again.params, pt.params)


# --------------------------------------------------------------------------
# 3. Errors.


def _rewrite_config(path, dest, **changes):
  """A copy of checkpoint `path` at `dest` with config.json edited."""
  os.makedirs(dest)
  with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  config.update(changes)
  with open(os.path.join(dest, "config.json"), "w", encoding="utf-8") as f:
    json.dump(config, f)
  os.symlink(os.path.join(path, "model.safetensors"),
             os.path.join(dest, "model.safetensors"))
  return str(dest)


@pytest.mark.parametrize("changes, expected", [
    (dict(model_type="gpt2"),
     "model_type='gpt2'; albert_jax reads checkpoints of model types albert, "
     "bert, electra, roberta"),
    (dict(position_embedding_type="relative_key_query"),
     "position_embedding_type='relative_key_query'"),
    (dict(is_decoder=True), "is_decoder=true"),
    (dict(num_hidden_layers=3),
     "bert.encoder.layer.2.attention.self.query.weight: missing (config "
     "expects (24, 24))"),
    (dict(type_vocab_size=3),
     "bert.embeddings.token_type_embeddings.weight: checkpoint (2, 24), "
     "config expects (3, 24)"),
])
def test_bad_config_is_named(zoo, tmp_path, changes, expected):
  path = _rewrite_config(zoo.saved("bert", "BertForPreTraining")[1],
                         tmp_path / "bad", **changes)
  with pytest.raises(CheckpointError) as error:
    load_pretrained(path)
  assert expected in str(error.value)


def test_untied_decoder_is_refused(zoo, tmp_path):
  model, path = zoo.saved("roberta", "RobertaForMaskedLM")
  dest = _rewrite_config(path, tmp_path / "untied")
  os.remove(os.path.join(dest, "model.safetensors"))
  state = {k: v.clone() for k, v in model.state_dict().items()}
  state["lm_head.decoder.weight"] += 1.0
  torch.save(state, os.path.join(dest, "pytorch_model.bin"))
  with pytest.raises(CheckpointError, match="lm_head.decoder.weight differs"):
    load_pretrained(dest)


def test_export_to_a_family_without_the_structure_is_refused(zoo, tmp_path):
  pt = load_pretrained(zoo.saved("electra", "ElectraForPreTraining")[1])
  with pytest.raises(ValueError, match="only ELECTRA has a replaced-token"):
    pt.to_hf(str(tmp_path), model_type="bert")
  with pytest.raises(ValueError, match="HF's ALBERT shares every layer"):
    pt.to_hf(str(tmp_path), model_type="albert")
  assert not os.listdir(tmp_path)


def test_legacy_layer_norm_names_load(zoo, tmp_path):
  """LayerNorm.gamma / .beta (old TF conversions such as bert-base-uncased)
  load as LayerNorm.weight / .bias, as transformers renames them."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  _, path = zoo.saved("bert", "BertForPreTraining")
  state = load_file(os.path.join(path, "model.safetensors"))
  legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
      "LayerNorm.bias", "LayerNorm.beta"): v for k, v in state.items()}
  # Embeddings, two per layer, the MLM transform.
  assert sum(".gamma" in k for k in legacy) == 1 + 2 * 2 + 1
  dest = _rewrite_config(path, tmp_path / "legacy")
  os.remove(os.path.join(dest, "model.safetensors"))
  save_file(legacy, os.path.join(dest, "model.safetensors"))
  assert_trees_equal(load_pretrained(dest).params,
                     load_pretrained(path).params)
