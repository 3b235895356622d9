"""Tests for SQuAD fine-tuning: tokenizer offsets, features (through TFDS's
mock), heads and losses, post-processing through the Task, and files."""

import gzip
import importlib.util
import itertools
import json
import os
import string

import flax.linen as nn
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
from locations import CONFIGS
from locations import CORPUS
import tfds_fakes  # pylint: disable=g-bad-import-order
import numpy as np
import pytest

from albert_jax.finetune import task as task_lib
from albert_jax.finetune.tasks.squad import head as squad_head
from albert_jax.finetune.tasks.squad import task as squad
from albert_jax.model.config import ModelConfig
from albert_jax.text import train_tokenizer as text_train
from albert_jax.text.preprocess import ALBERT_USER_SYMBOLS
from albert_jax.text.preprocess import preprocess_text
from albert_jax.text.preprocess import preprocess_with_alignment
from albert_jax.text.preprocess import SPIECE_UNDERLINE
from albert_jax.text.tokenizer import Tokenizer
from albert_jax.finetune.tfds_source import TfdsSource

tfds = pytest.importorskip("tensorflow_datasets")
pytest.importorskip("tensorflow")  # tfds_fakes serves through tf.data

SEQ = 48


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  """1000 pieces with ALBERT's user symbols and "9,"-style number pieces."""
  d = tmp_path_factory.mktemp("spm")
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    lines = list(itertools.islice(f, 1500))
  rng = np.random.default_rng(0)
  lines += [f"In {y} the fund paid {a:,} dollars, or {b:,}, to 1,{c:03d}.\n"
            for y, a, b, c in rng.integers(1, 10**6, (300, 4))]
  (d / "corpus.txt").write_text("".join(lines), encoding="utf-8")
  return text_train.train(str(d / "corpus.txt"), 1000,
                          output=d / "spiece.model", seed=1, num_threads=2,
                          user_symbols=ALBERT_USER_SYMBOLS)


@pytest.fixture(scope="module")
def variants(tok):
  """The model under each (do_lower_case, keep_accents) setting."""
  return {(lower, accents): Tokenizer.from_file(
      tok.path, do_lower_case=lower, keep_accents=accents)
          for lower in (True, False) for accents in (True, False)}


################################################################################
# Tokenizer.encode_with_offsets.
################################################################################


def _check_offsets(tokenizer, text):
  ids, offsets = tokenizer.encode_with_offsets(text)
  assert ids == tokenizer.encode(text), text
  assert len(offsets) == len(ids)
  starts = [s for s, _ in offsets]
  ends = [e for _, e in offsets]
  assert starts == sorted(starts) and ends == sorted(ends), (text, offsets)
  assert all(0 <= s <= e <= len(text) for s, e in offsets), (text, offsets)
  return ids, offsets


def test_offsets_map_through_the_normalisation(tok):
  text = "``Café'' costs 9,000  dollars, or 12,345."
  ids, offsets = _check_offsets(tok, text)
  surfaces = [text[s:e] for s, e in offsets]
  # The pieces tile the text's non-space characters, in order, each piece
  # its original surface (accent and case kept, `` for the rewritten ").
  assert "".join(surfaces) == "".join(text.split())
  assert surfaces.count("``") == surfaces.count("''") == 1
  assert "".join(surfaces[surfaces.index("``") + 1:
                          surfaces.index("''")]) == "Café"
  # "9," was one piece; the official split makes it "9" ",".
  pieces = tok.sp_model.encode(tok.normalize(text), out_type=str)
  assert "9," in pieces and "9," not in tok.tokenize(text)
  split_at = tok.tokenize(text).index("9")
  assert surfaces[split_at:split_at + 2] == ["9", ","]
  assert ids[split_at + 1] == tok.piece_to_id(",")


# Any character, with the ones the normalisation rewrites made frequent.
_TRICKY = "`'\" \t\n\u00a0éÉüİΣς,0123456789\u0301\ufb01\u2460"
_ANY_TEXT = st.text(alphabet=st.one_of(st.characters(codec="utf-8"),
                                       st.sampled_from(_TRICKY)), max_size=60)
_SETTINGS = st.sampled_from([(True, False), (False, False), (True, True),
                             (False, True)])


@settings(max_examples=150, deadline=None)
@given(text=_ANY_TEXT, setting=_SETTINGS)
def test_offsets_on_any_unicode(variants, text, setting):
  tokenizer = variants[setting]
  norm, spans = preprocess_with_alignment(text, *setting)
  assert norm == preprocess_text(text, *setting)
  assert len(spans) == len(norm)
  assert all(0 <= s < e <= len(text) for s, e in spans)
  _check_offsets(tokenizer, text)


_WORD = st.text(alphabet=string.ascii_letters + string.digits, min_size=1,
                max_size=10)
_SEP = st.sampled_from([" ", "  ", "\t", "\n ", ", ", ". ", " (", ") ", "``",
                        "''", " - ", ",", "'s "])


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(st.tuples(_WORD, _SEP), max_size=12),
       lower=st.booleans())
def test_offsets_of_ascii_words_cover_the_piece(variants, parts, lower):
  tokenizer = variants[(lower, False)]
  text = "".join(w + s for w, s in parts)
  _, offsets = _check_offsets(tokenizer, text)
  pieces = tokenizer.tokenize(text)
  surfaces = [text[s:e] for s, e in offsets]
  assert "".join(surfaces) == "".join(text.split())
  for piece, surface in zip(pieces, surfaces):
    body = piece.replace(SPIECE_UNDERLINE, "")
    if body.isascii() and body.isalnum():
      assert (surface.lower() if lower else surface) == body, (text, piece)


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
  words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick",
           "brown", "fox", "jump", "##s", "##ed", "cafe", "caf", "##é", ",",
           ".", "'", "9", "000", "##0", "日", "本"]
  d = tmp_path_factory.mktemp("wp")
  (d / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
  return Tokenizer.from_file(d / "vocab.txt")


def test_wordpiece_offsets(wordpiece):
  text = "The quick  fox jumps, Café 9,000 日本"
  ids, offsets = _check_offsets(wordpiece, text)
  assert [text[s:e] for s, e in offsets] == [
      "The", "quick", "fox", "jump", "s", ",", "Café", "9", ",", "000", "日",
      "本"]
  assert ids[:3] == [wordpiece.piece_to_id(p) for p in ("the", "quick", "fox")]


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=40))
def test_wordpiece_offsets_on_any_unicode(wordpiece, text):
  _check_offsets(wordpiece, text)


################################################################################
# Features.
################################################################################

CONTEXT = ("The Normans (Norman: Nourmands; French: Normands) were the people "
           "who in the 10th and 11th centuries gave their name to Normandy, a "
           "region in France.")
QUESTIONS = [
    ("q-country", "In what country is Normandy located?", ["France"]),
    ("q-when", "When were the Normans in Normandy?",
     ["10th and 11th centuries", "in the 10th and 11th centuries"]),
    ("q-none", "Who gave their name to France?", []),
]


def _squad_row(qid, question, answers, v2):
  row = {"id": qid, "title": "Normans", "context": CONTEXT,
         "question": question,
         "answers": {"text": answers,
                     "answer_start": [CONTEXT.index(a) for a in answers]}}
  if v2:
    row.update(is_impossible=not answers,
               plausible_answers={"text": [], "answer_start": []})
  return row


def _task(name, **data):
  return squad.make_task(name, {"doc_stride": 8, "max_query_length": 12,
                                "n_best_size": 5, "max_answer_length": 16,
                                **data})


def _load(task, split, tok, questions=QUESTIONS):
  v2 = task.version_2
  rows = [_squad_row(*q, v2) for q in questions if v2 or q[2]]
  with tfds.testing.mock_data(as_dataset_fn=tfds_fakes.serving(rows)):
    return task.load(split, tok, SEQ)


def test_make_task_checks_its_arguments():
  with pytest.raises(ValueError, match=r"squad/v1\.1.*squad/v2\.0"):
    squad.make_task("squad/v3", {})
  with pytest.raises(ValueError, match="v2_head"):
    squad.make_task("squad/v2.0", {"v2_head": "xlnet"})
  with pytest.raises(ValueError, match="doc_stride"):
    squad.make_task("squad/v1.1", {"doc_stride": 0})
  task = squad.make_task("squad/v2.0", {})
  assert (task.metric, task.eval_splits, task.head_kind) == (
      "f1", ("validation",), "official")
  assert (task.doc_stride, task.max_query_length, task.n_best_size,
          task.max_answer_length) == (128, 64, 20, 30)


def _repo_config(name, arg):
  spec = importlib.util.spec_from_file_location(
      name, CONFIGS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_the_squad_config_makes_the_official_task(version):
  data = _repo_config("squad", f"version={version}").data
  task = squad.make_task(data.task, data)
  assert task.name == f"squad/v{version}"
  assert task.head_kind == ("official" if version == "2.0" else "span")
  assert (task.doc_stride, task.max_query_length, task.n_best_size,
          task.max_answer_length, task.source) == (
              128, 64, 20, 30, TfdsSource(None, True))


def test_the_squad_config_refuses_an_unknown_version():
  with pytest.raises(ValueError, match=r"Unknown SQuAD version '3\.0'; "
                     r"choose one of \['1\.1', '2\.0'\]"):
    _repo_config("squad", "version=3.0")


def test_doc_windows():
  assert squad.doc_windows(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
  assert squad.doc_windows(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
  assert squad.doc_windows(3, 4, 2) == [(0, 3)]
  assert squad.doc_windows(0, 4, 2) == [(0, 0)]


def test_answer_token_span():
  offsets = np.array([[0, 3], [4, 4], [4, 9], [10, 12]])
  assert squad.answer_token_span(offsets, 4, 9) == (2, 2)
  assert squad.answer_token_span(offsets, 0, 12) == (0, 3)
  assert squad.answer_token_span(offsets, 2, 11) == (0, 3)
  assert squad.answer_token_span(offsets, 3, 4) is None  # only a space


def _official_is_max_context(spans, cur, position):
  """albert/squad_utils._check_is_max_context, verbatim in logic."""
  best_score, best_index = None, None
  for index, (start, length) in enumerate(spans):
    end = start + length - 1
    if position < start or position > end:
      continue
    score = min(position - start, end - position) + 0.01 * length
    if best_score is None or score > best_score:
      best_score, best_index = score, index
  return cur == best_index


@pytest.mark.parametrize("n,max_tokens,stride", [(10, 4, 2), (23, 7, 3),
                                                 (9, 9, 4), (30, 8, 8)])
def test_max_context_matches_the_official_rule(n, max_tokens, stride):
  spans = squad.doc_windows(n, max_tokens, stride)
  best = squad.max_context_window(spans, n)
  for i, (start, length) in enumerate(spans):
    for p in range(start, start + length):
      assert (best[p] == i) == _official_is_max_context(spans, i, p)


@pytest.mark.parametrize("name", ["squad/v1.1", "squad/v2.0"])
def test_features(tok, name):
  task = _task(name)
  split = _load(task, "validation", tok)
  f, ex = split.features, split.examples
  n = split.num_rows
  for key in ("input_ids", "token_type_ids", "attention_mask"):
    assert f[key].shape == (n, SEQ) and f[key].dtype == np.int32
  assert f["p_mask"].shape == (n, SEQ) and f["p_mask"].dtype == bool
  for key in ("start_positions", "end_positions", "is_impossible"):
    assert f[key].shape == (n,) and f[key].dtype == np.int32
  assert ex.ids == [q[0] for q in QUESTIONS if task.version_2 or q[2]]
  context_ids, offsets = tok.encode_with_offsets(CONTEXT)
  rows_seen = 0
  for e, (qid, question, answers) in enumerate(
      q for q in QUESTIONS if task.version_2 or q[2]):
    assert ex.answers[e] == answers
    query = tok.encode(question)[:12]
    head = len(query) + 2
    spans = squad.doc_windows(len(context_ids), SEQ - head - 1, 8)
    rows = np.flatnonzero(ex.row_example == e)
    assert len(rows) == len(spans) > 1
    found = 0
    for r, (start, length) in zip(rows, spans):
      n_real = head + length + 1
      expected = ([tok.cls_id] + query + [tok.sep_id] +
                  context_ids[start:start + length] + [tok.sep_id])
      np.testing.assert_array_equal(f["input_ids"][r, :n_real], expected)
      assert (f["input_ids"][r, n_real:] == tok.pad_id).all()
      np.testing.assert_array_equal(
          f["token_type_ids"][r], [0] * head + [1] * (length + 1) +
          [0] * (SEQ - n_real))
      np.testing.assert_array_equal(
          f["attention_mask"][r], [1] * n_real + [0] * (SEQ - n_real))
      np.testing.assert_array_equal(
          f["p_mask"][r], [0] + [1] * (head - 1) + [0] * length +
          [1] * (SEQ - n_real + 1))
      np.testing.assert_array_equal(
          ex.token_start[r, head:head + length],
          [o[0] for o in offsets[start:start + length]])
      assert (ex.token_start[r, :head] == -1).all()
      assert (ex.token_start[r, head + length:] == -1).all()
      s, t = f["start_positions"][r], f["end_positions"][r]
      if s:
        found += 1
        assert f["is_impossible"][r] == 0
        assert CONTEXT[ex.token_start[r, s]:ex.token_end[r, t]] == answers[0]
      else:
        assert (t, f["is_impossible"][r]) == (0, 1)
    # The answer lies inside at least one window; unanswerable: none.
    assert found >= 1 if answers else found == 0
    rows_seen += len(rows)
  assert rows_seen == n


def test_misplaced_answers_are_labelled_no_answer(tok):
  task = _task("squad/v1.1")
  bad = ("q-bad", "Where?", ["France"])
  rows = [_squad_row(*QUESTIONS[0], False), _squad_row(*bad, False)]
  rows[1]["answers"]["answer_start"] = [3]  # not where "France" is
  with tfds.testing.mock_data(as_dataset_fn=tfds_fakes.serving(rows)):
    with pytest.warns(UserWarning, match="1 of 2 questions"):
      train = task.load("train", tok, SEQ)
    with pytest.warns(UserWarning, match="1 of 2 questions"):
      evaluation = task.load("validation", tok, SEQ)
  assert train.examples is None
  assert train.num_rows == evaluation.num_rows
  ex, f = evaluation.examples, evaluation.features
  assert ex.ids == ["q-country", "q-bad"] and ex.answers[1] == ["France"]
  good, bad_rows = ex.row_example == 0, ex.row_example == 1
  assert f["start_positions"][good].max() > 0
  assert (f["start_positions"][bad_rows] == 0).all()
  assert (f["is_impossible"][bad_rows] == 1).all()


@pytest.mark.filterwarnings("ignore:.*not at its answer_start")
@pytest.mark.parametrize("name", ["squad/v1.1", "squad/v2.0"])
def test_random_mock_data_loads(tok, name):
  task = _task(name)
  with tfds.testing.mock_data(num_examples=3):
    for split in ("train", "validation"):
      loaded = task.load(split, tok, SEQ)
      assert loaded.num_rows >= 3
  assert len(loaded.examples.ids) == 3


def test_max_seq_length_too_short(tok):
  task = _task("squad/v1.1", max_query_length=64)
  rows = [_squad_row("q", "word " * 60, ["France"], False)]
  with tfds.testing.mock_data(as_dataset_fn=tfds_fakes.serving(rows)):
    with pytest.raises(ValueError, match="max_query_length"):
      task.load("validation", tok, 16)


################################################################################
# Heads, losses and predictions.
################################################################################


def _config(vocab_size):
  return ModelConfig(vocab_size=vocab_size, embedding_size=16, hidden_size=32,
                     num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=SEQ,
                     hidden_dropout_prob=0.1, classifier_dropout_prob=0.1)


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_simple_v2_head_is_the_span_head():
  task = _task("squad/v2.0", v2_head="simple")
  assert isinstance(task.head(_config(100)), squad_head.SpanHead)
  assert isinstance(_task("squad/v2.0").head(_config(100)),
                    squad_head.AlbertV2Head)


# The simple v2.0 head is the v1.1 one (same module, loss and predictions).
@pytest.mark.parametrize("name,head", [("squad/v1.1", "span"),
                                       ("squad/v2.0", "official")])
def test_head_loss_and_predict(tok, name, head, fast_compile):
  task = _task(name, **({} if head == "span" else {"v2_head": head}))
  assert task.head_kind == head
  split = _load(task, "validation", tok)
  # The features the spec builds the step from are what `load` gives.
  seq = split.features["input_ids"].shape[1]
  for key, (shape, dtype) in task.batch_features(seq).items():
    assert split.features[key].shape[1:] == shape, key
    assert split.features[key].dtype == dtype, key
  cfg = _config(tok.vocab_size)
  model = task_lib.FineTuneModel(cfg, task.head(cfg))
  batch = {k: v[:3] for k, v in split.features.items()}
  batch["weights"] = np.array([1.0, 1.0, 0.0], np.float32)
  params = jax.jit(lambda r: model.init(r, batch, deterministic=True),
                   compiler_options=fast_compile)(jax.random.key(0))["params"]
  params = nn.meta.unbox(params)

  def run(params, batch, rng):
    train = model.apply({"params": params}, batch, deterministic=False,
                        rngs={"dropout": rng})
    infer = model.apply({"params": params}, batch, deterministic=True)
    return (train, task.loss_sums(train, batch), task.predict(infer, batch),
            infer)
  run = jax.jit(run, compiler_options=fast_compile)
  outputs, sums, preds, _ = run(params, batch, jax.random.key(1))
  k = task.start_n_top
  if task.head_kind == "official":
    h = cfg.hidden_size
    shapes = jax.tree.map(lambda p: p.shape, params["head"])
    assert shapes == {
        "start_dense": {"kernel": (h, 1), "bias": (1,)},
        "end_dense_0": {"kernel": (2 * h, h), "bias": (h,)},
        "end_layer_norm": {"scale": (h,), "bias": (h,)},
        "end_dense_1": {"kernel": (h, 1), "bias": (1,)},
        "answer_dense_0": {"kernel": (2 * h, h), "bias": (h,)},
        "answer_dense_1": {"kernel": (h, 1)}}
    # The beam's ends for its best start are the gold-start end network's.
    gold = dict(batch,
                start_positions=np.asarray(preds["start_top_index"][:, 0]))
    *_, infer = run(params, gold, jax.random.key(1))
    top = jax.lax.top_k(jax.nn.log_softmax(infer["end_logits"]),
                        task.end_n_top)
    np.testing.assert_allclose(preds["end_top_log_probs"][:, :task.end_n_top],
                               top[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(preds["end_top_index"][:, :task.end_n_top],
                                  top[1])
    assert preds["start_top_index"].shape == (3, k)
    assert preds["start_top_log_probs"].shape == (3, k)
    assert preds["end_top_index"].shape == (3, k * task.end_n_top)
    assert preds["end_top_log_probs"].shape == (3, k * task.end_n_top)
    assert preds["cls_logits"].shape == (3,)
    # The beam is sorted, and masked positions never make it in.
    lp = np.asarray(preds["start_top_log_probs"])
    assert (np.diff(lp, axis=1) <= 0).all()
    idx = np.asarray(preds["start_top_index"])
    assert not np.take_along_axis(batch["p_mask"], idx, 1).any()
  else:
    assert preds["start_logits"].shape == preds["end_logits"].shape == (3, SEQ)
    assert preds["start_logits"].dtype == jnp.float32
  # Masked positions hold -1e30; [CLS] and the context stay open.
  start = np.asarray(outputs["start_logits"])
  assert (start[batch["p_mask"]] == squad_head.NEG_INF).all()
  assert (start[~batch["p_mask"]] > -1e6).all()
  # The loss, row by row, in NumPy.
  rows = np.arange(3)
  nll = lambda key, pos: -_log_softmax(np.asarray(
      outputs[key], np.float64))[rows, batch[pos]]
  per_row = 0.5 * (nll("start_logits", "start_positions") +
                   nll("end_logits", "end_positions"))
  if task.head_kind == "official":
    z, y = np.asarray(outputs["cls_logits"], np.float64), batch["is_impossible"]
    per_row += 0.5 * (np.maximum(z, 0) - z * y + np.log1p(np.exp(-abs(z))))
  assert np.isfinite(float(sums["loss_sum"]))
  np.testing.assert_allclose(float(sums["loss_sum"]), per_row[:2].sum(),
                             rtol=1e-5)
  # A zero-weight row changes nothing, whatever it holds.
  other = dict(batch)
  other["input_ids"] = batch["input_ids"].copy()
  other["input_ids"][2] = tok.unk_id
  other["start_positions"] = batch["start_positions"].copy()
  other["start_positions"][2] = 5
  _, sums2, _, _ = run(params, other, jax.random.key(1))
  assert float(sums2["loss_sum"]) == pytest.approx(float(sums["loss_sum"]),
                                                   rel=1e-6)
  assert 0 <= float(sums["correct_sum"]) <= 2


################################################################################
# Evaluation and files through the Task.
################################################################################


def _token_at(ex, row, char, side):
  """The context token of `row` starting (side 0) / ending (1) at `char`."""
  table = ex.token_start if side == 0 else ex.token_end
  hits = np.flatnonzero(table[row] == char)
  hits = hits[ex.token_start[row, hits] >= 0]
  return int(hits[0]) if len(hits) else None


def _span_logits(split, spans):
  """Start/end logits [N, T]: 10 at each question's chosen span (in every
  window holding it), -10 elsewhere, [CLS] at `cls` per question."""
  ex, n = split.examples, split.num_rows
  start, end = np.full((n, SEQ), -10.0), np.full((n, SEQ), -10.0)
  for row in range(n):
    qid = ex.ids[ex.row_example[row]]
    text, cls = spans[qid]
    start[row, 0] = end[row, 0] = cls
    if text is None:
      continue
    c = CONTEXT.index(text)
    s, t = _token_at(ex, row, c, 0), _token_at(ex, row, c + len(text), 1)
    if s is not None and t is not None:
      start[row, s], end[row, t] = 10.0, 10.0
  return {"start_logits": start, "end_logits": end}


def test_v1_evaluate_and_files(tok, tmp_path):
  task = _task("squad/v1.1")
  split = _load(task, "validation", tok)
  preds = _span_logits(split, {"q-country": ("France", 0.0),
                               "q-when": ("10th and 11th", 0.0)})
  # q-when: P 3/3, R 3/4 against "10th and 11th centuries" → F1 6/7.
  assert task.evaluate(preds, split) == {
      "exact_match": pytest.approx(50.0),
      "f1": pytest.approx(100 * (1 + 6 / 7) / 2)}
  paths = task.write_predictions(preds, split, str(tmp_path))
  assert [os.path.basename(p) for p in paths] == [
      "predictions.json", "nbest_predictions.json"]
  with open(paths[0], encoding="utf-8") as f:
    assert json.load(f) == {"q-country": "France", "q-when": "10th and 11th"}
  with open(paths[1], encoding="utf-8") as f:
    nbest = json.load(f)
  assert set(nbest) == {"q-country", "q-when"}
  top = nbest["q-country"][0]
  assert (top["text"], top["start_logit"], top["end_logit"]) == (
      "France", 10.0, 10.0)
  assert sum(x["probability"] for x in nbest["q-when"]) == pytest.approx(1.0)
  assert len(nbest["q-when"]) <= task.n_best_size


def test_v2_simple_evaluate_and_files(tok, tmp_path):
  task = _task("squad/v2.0", v2_head="simple")
  split = _load(task, "validation", tok)
  # Spans score 20; [CLS] 0 for the answerable questions, 30 (15 + 15) for
  # the unanswerable one, whose best span is "Normandy".
  preds = _span_logits(split, {"q-country": ("France", 0.0),
                               "q-when": ("10th and 11th centuries", 0.0),
                               "q-none": ("Normandy", 15.0)})
  metrics = task.evaluate(preds, split)
  # Null odds: -20, -20, 30 - 20 = 10. From "all null" (1 right), switching
  # q-country and q-when adds 2 (best, threshold -20); q-none then loses 1.
  assert metrics == {
      "exact": 100.0, "f1": 100.0, "total": 3, "HasAns_exact": 100.0,
      "HasAns_f1": 100.0, "HasAns_total": 2, "NoAns_exact": 100.0,
      "NoAns_f1": 100.0, "NoAns_total": 1, "best_exact": 100.0,
      "best_exact_thresh": -20.0, "best_f1": 100.0, "best_f1_thresh": -20.0}
  paths = task.write_predictions(preds, split, str(tmp_path))
  assert [os.path.basename(p) for p in paths] == [
      "predictions.json", "nbest_predictions.json", "null_odds.json"]
  with open(paths[0], encoding="utf-8") as f:
    assert json.load(f) == {"q-country": "France",
                            "q-when": "10th and 11th centuries",
                            "q-none": ""}
  with open(paths[2], encoding="utf-8") as f:
    assert json.load(f) == {"q-country": -20.0, "q-when": -20.0,
                            "q-none": 10.0}
  with open(paths[1], encoding="utf-8") as f:
    nbest = json.load(f)
  # The null span ranks first for q-none and is in every list.
  assert nbest["q-none"][0] == {"text": "", "probability": pytest.approx(
      nbest["q-none"][0]["probability"]), "start_logit": 15.0,
                                "end_logit": 15.0}
  assert all("" in [x["text"] for x in v] for v in nbest.values())


def test_v2_albert_evaluate_and_files(tok, tmp_path):
  task = _task("squad/v2.0")
  split = _load(task, "validation", tok)
  ex, n = split.examples, split.num_rows
  k, k2 = task.start_n_top, task.end_n_top
  preds = {"start_top_index": np.zeros((n, k), np.int32),
           "start_top_log_probs": np.full((n, k), -5.0),
           "end_top_index": np.zeros((n, k * k2), np.int32),
           "end_top_log_probs": np.full((n, k * k2), -5.0),
           "cls_logits": np.zeros(n)}
  answer = {"q-country": "France", "q-when": "11th centuries",
            "q-none": "Normandy"}
  cls = {"q-country": -3.0, "q-when": -1.0, "q-none": 4.0}
  for row in range(n):
    qid = ex.ids[ex.row_example[row]]
    text = answer[qid]
    c = CONTEXT.index(text)
    s, t = _token_at(ex, row, c, 0), _token_at(ex, row, c + len(text), 1)
    # Per window: a cls logit a little above the question's minimum.
    preds["cls_logits"][row] = cls[qid] + (0.5 if s is None else 0.0) + row
    if s is not None and t is not None:
      preds["start_top_index"][row, 0], preds["end_top_index"][row, 0] = s, t
      preds["start_top_log_probs"][row, 0] = -0.1
      preds["end_top_log_probs"][row, 0] = -0.2
  paths = task.write_predictions(preds, split, str(tmp_path))
  with open(paths[2], encoding="utf-8") as f:
    odds = json.load(f)
  # Null odds: the minimum cls logit over each question's windows.
  for qid in cls:
    rows = np.flatnonzero(np.array(ex.ids)[ex.row_example] == qid)
    assert odds[qid] == pytest.approx(float(preds["cls_logits"][rows].min()))
  metrics = task.evaluate(preds, split)
  # q-when's answer "11th centuries" has F1 2/3 against its gold
  # ("10th and 11th centuries": P 1, R 1/2). In odds order q-country (+1),
  # q-when (+2/3), q-none (-1): the best threshold is q-when's odds.
  assert metrics["best_f1"] == pytest.approx(100 * (1 + 1 + 2 / 3) / 3)
  assert metrics["best_f1_thresh"] == pytest.approx(odds["q-when"])
  assert metrics["best_exact"] == pytest.approx(100 * 2 / 3)
  assert metrics["best_exact_thresh"] == pytest.approx(odds["q-country"])
  assert metrics["f1"] == pytest.approx(metrics["best_f1"])
  assert (metrics["HasAns_total"], metrics["NoAns_total"]) == (2, 1)
  assert metrics["NoAns_exact"] == 100.0
  with open(paths[0], encoding="utf-8") as f:
    assert json.load(f) == {"q-country": "France", "q-when": "11th centuries",
                            "q-none": ""}
  with open(paths[1], encoding="utf-8") as f:
    nbest = json.load(f)
  assert nbest["q-country"][0]["text"] == "France"
  assert nbest["q-country"][0]["start_log_prob"] == pytest.approx(-0.1)


def test_concat_dense_is_a_dense_on_the_concatenation():
  layer = squad_head.ConcatDense(3, init_range=0.5)
  rng = np.random.default_rng(0)
  a = rng.normal(size=(2, 4, 1, 5)).astype(np.float32)
  b = rng.normal(size=(2, 1, 3, 2)).astype(np.float32)
  params = nn.meta.unbox(layer.init(jax.random.key(2), a, b)["params"])
  params = {"kernel": np.asarray(params["kernel"]), "bias": np.arange(3.0)}
  got = jax.jit(layer.apply)({"params": params}, a, b)
  concat = np.concatenate([np.broadcast_to(a, (2, 4, 3, 5)),
                           np.broadcast_to(b, (2, 4, 3, 2))], axis=-1)
  np.testing.assert_allclose(got, concat @ params["kernel"] + params["bias"],
                             rtol=1e-5, atol=1e-6)
