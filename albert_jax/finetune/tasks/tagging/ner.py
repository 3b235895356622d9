"""Token classification (named entities): CoNLL-2003 files or TFDS.

Each sentence is a list of words with one tag each ("B-PER", "I-LOC", "O",
...). A row is `[CLS] sub-words of every word [SEP]`; a word's tag is
learned and predicted on its first sub-word, its other sub-words carrying
label -1 (no loss), as BERT's NER fine-tuning does (Devlin et al. 2019,
sec. 5.3). Words past `max_seq_length` are cut off and predicted "O". The
head is dropout then dense(num_labels) on every token's output; the loss is
each row's mean cross entropy over its labelled sub-words.

Metrics: conlleval's entity-level precision, recall and F1
(`albert_jax.finetune.tasks.tagging.conlleval`; "f1" selects the checkpoint) and token
accuracy. Prediction files: `<split>_predictions.txt`, "word gold
guessed" per line and a blank line after each sentence, the input
conlleval.pl reads.

`make_task(name, data)`:
  "ner/files": CoNLL-format files (`data.train_file`, `data.eval_file`,
    optional `data.test_file`; local or gs://, optionally .gz): one word per
    line, its first field the word and its last the tag (CoNLL-2003's
    "EU NNP B-NP B-ORG"), a blank line between sentences, "-DOCSTART-"
    lines skipped. `data.labels` fixes the tag set and its order (default:
    the train file's tags, sorted, "O" first).
  "ner/conll2003": TFDS `conll2003` (train, validation, test), its "ner"
    tags; `data.tfds_data_dir`, `data.tfds_download` as for GLUE.

The models they fine-tune are `TOKEN_CLASSIFICATION`: a text → {"entities":
[{"text", "label", "start", "end"}], "words", "tags"}.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from albert_jax import storage
from albert_jax.finetune import packing
from albert_jax.finetune import tabular
from albert_jax.finetune import task_type as task_type_lib
from albert_jax.finetune.task import Split
from albert_jax.finetune.task import Task
from albert_jax.finetune.task_type import PredictError
from albert_jax.finetune.tasks.tagging import conlleval
from albert_jax.finetune.tfds_source import TfdsSource
from albert_jax.model import layers
from albert_jax.model.config import ModelConfig

TASKS = ("ner/files", "ner/conll2003")
DOCSTART = "-DOCSTART-"


@dataclasses.dataclass(frozen=True)
class Sentences:
  """A split's sentences.

  Attributes:
    words: one list of words per sentence.
    tags: the gold tags, the same shape, or None (unlabelled).
    first: [N, T] int32, the word whose first sub-word each position holds,
      -1 elsewhere ([CLS], [SEP], later sub-words, padding).
  """
  words: list
  tags: Optional[list]
  first: np.ndarray


def read_conll(path: str, what: str = "data file"
               ) -> tuple[list[list[str]], list[list[str]]]:
  """(words, tags) per sentence of a CoNLL-format file (see the module
  docstring).

  Raises:
    tabular.FileFormatError: a missing or empty file, or a line with one
      field (no tag).
  """
  path = os.fspath(path)
  if not storage.path(path).is_file():
    raise tabular.FileFormatError(f"{what} {path!r} does not exist; check "
                                  "the path.")
  sentences, words, tags = [], [], []
  for number, text in tabular.iter_lines(path):
    fields = text.split()
    if not fields or fields[0] == DOCSTART:
      if words:
        sentences.append((words, tags))
        words, tags = [], []
      continue
    if len(fields) < 2:
      raise tabular.FileFormatError(
          f"{what} {path}, line {number}: {text.strip()!r} has no tag; "
          "write the word, then its tag last, separated by spaces or tabs "
          "(CoNLL-2003: 'EU NNP B-NP B-ORG').")
    words.append(fields[0])
    tags.append(fields[-1])
  if words:
    sentences.append((words, tags))
  if not sentences:
    raise tabular.FileFormatError(f"{what} {path} holds no sentences.")
  return [s[0] for s in sentences], [s[1] for s in sentences]


_IOB = re.compile(r"O|[BIE]-\S+")


def check_iob(tags: Sequence[str], what: str) -> None:
  """Refuses tags other than "O", "B-TYPE", "I-TYPE" and "E-TYPE": entity
  F1 (conlleval) and the predicted entities read only those, so a tag such
  as "PER" or "B_LOC" would be trained and then never count.

  Raises:
    tabular.FileFormatError: naming the tags, the file and a renaming.
  """
  bad = [t for t in tags if not _IOB.fullmatch(t)]
  if not bad:
    return
  first = bad[0]
  spelt = re.fullmatch(r"([BIESL])[^A-Za-z0-9](.+)", first)
  if spelt:
    prefix = {"S": "B", "L": "E"}.get(spelt.group(1), spelt.group(1))
    fix = f"{first!r} as '{prefix}-{spelt.group(2)}'"
  else:
    fix = (f"{first!r} as 'B-{first}' on an entity's first word and "
           f"'I-{first}' on the words after it")
  raise tabular.FileFormatError(
      f"{what} has tags {bad[:5]} that are not IOB tags ('O', 'B-TYPE', "
      "'I-TYPE' or 'E-TYPE'); entity F1 and the predicted entities read "
      "only those, so these would be trained and never count. Rename "
      f"them, e.g. write {fix}.")


def read_tfds(split: str, source: TfdsSource
              ) -> tuple[list[list[str]], list[list[str]]]:
  """(words, tags) of TFDS `conll2003` split `split`, read from `source`."""
  names = tag_names(source)
  words, tags = [], []
  for ex in source.examples("conll2003", split):
    words.append([w.decode("utf-8") if isinstance(w, bytes) else str(w)
                  for w in ex["tokens"]])
    tags.append([names[int(t)] for t in ex["ner"]])
  return words, tags


def tag_names(source: TfdsSource) -> tuple[str, ...]:
  """The tag names of TFDS `conll2003`, from its builder's description: no
  data is read or downloaded (`--compile_only` builds the head from them)."""
  return tuple(source.builder("conll2003").info.features["ner"].feature.names)


def encode_words(tokenizer, sentences: Sequence[Sequence[str]],
                 max_seq_length: int) -> dict[str, np.ndarray]:
  """`[CLS] sub-words [SEP]` rows of word lists.

  Returns:
    "input_ids", "token_type_ids", "attention_mask" [N, T] int32 and
    "first" [N, T] int32 (see `Sentences.first`). A word that encodes to
    no token, or does not fit, has no position (it is predicted "O").
  """
  if tokenizer.cls_id is None or tokenizer.sep_id is None:
    raise ValueError("Token classification needs [CLS] and [SEP] pieces; "
                     "this vocabulary has none.")
  pad = 0 if tokenizer.pad_id is None else tokenizer.pad_id
  n, t = len(sentences), max_seq_length
  out = {"input_ids": np.full((n, t), pad, np.int32),
         "token_type_ids": np.zeros((n, t), np.int32),
         "attention_mask": np.zeros((n, t), np.int32),
         "first": np.full((n, t), -1, np.int32)}
  for r, words in enumerate(sentences):
    ids = [tokenizer.cls_id]
    for w, word in enumerate(words):
      pieces = tokenizer.encode(word)
      if not pieces or len(ids) + len(pieces) > t - 1:
        if pieces:
          break  # the rest of the sentence does not fit
        continue
      out["first"][r, len(ids)] = w
      ids += pieces
    ids.append(tokenizer.sep_id)
    out["input_ids"][r, :len(ids)] = ids
    out["attention_mask"][r, :len(ids)] = 1
  return out


def word_tags(tag_ids: np.ndarray, first: np.ndarray, lengths: Sequence[int],
              labels: Sequence[str]) -> list[list[str]]:
  """Each sentence's predicted tag per word ("O" for words without a
  position) from [N, T] predicted tag ids at the first sub-words."""
  out = []
  for r, length in enumerate(lengths):
    tags = ["O"] * length
    for pos in np.flatnonzero(first[r] >= 0):
      tags[int(first[r, pos])] = labels[int(tag_ids[r, pos])]
    out.append(tags)
  return out


def entities(text: str, spans: Sequence[tuple[int, int]],
             tags: Sequence[str]) -> list[dict]:
  """The chunks of a tagged sentence as {"text", "label", "start", "end"},
  with character offsets into `text` from the words' `spans`."""
  out = []
  for kind, first, last in conlleval.chunks(tags):
    start, end = spans[first][0], spans[last - 1][1]
    out.append({"text": text[start:end], "label": kind, "start": start,
                "end": end})
  return out


def split_words(text: str) -> tuple[list[str], list[tuple[int, int]]]:
  """Whitespace-separated words and their [start, end) characters."""
  found = list(re.finditer(r"\S+", text))
  return [m.group() for m in found], [m.span() for m in found]


class TokenClassifierHead(nn.Module):
  """Dropout → dense on every token: [N, T, H] → "logits" [N, T, L] f32."""
  config: ModelConfig
  num_labels: int

  @nn.compact
  def __call__(self, encoded: dict, batch: dict,
               deterministic: bool = True) -> dict:
    del batch
    cfg = self.config
    x = nn.Dropout(cfg.classifier_dropout_prob)(
        encoded["sequence_output"], deterministic=deterministic)
    logits = layers.Dense((self.num_labels,), ("embed", "classes"),
                          **cfg.layer_kwargs, name="classifier")(x)
    return {"logits": logits.astype(jnp.float32)}


class TaggingTask(Task):
  """Named entities from CoNLL files or TFDS conll2003."""
  metric = "f1"
  train_split = "train"
  # Sentences pack side by side: labels and predicted tags are per token.
  packable = True
  token_keys = ("labels", "tags")

  def __init__(self, name: str, data):
    if name not in TASKS:
      raise ValueError(f"Unknown tagging task {name!r}; choose one of "
                       f"{TASKS}.")
    self.name = name
    self._read = {}
    if name == "ner/files":
      paths = {}
      for split in ("train", "eval", "test"):
        path = data.get(f"{split}_file", None)
        if path:
          paths[split] = path
        elif split != "test":
          raise ValueError(f"The 'ner/files' task needs data.{split}_file "
                           f"(e.g. '{split}.txt' in CoNLL-2003 format).")
      self._read = {s: read_conll(p, f"data.{s}_file")
                    for s, p in paths.items()}
      self.eval_splits = ("eval",)
      self.predict_splits = ("eval",) + (("test",) if "test" in paths
                                         else ())
      found = {t for tags in self._read["train"][1] for t in tags}
      given = data.get("labels", None)
      self.labels = (tuple(given) if given else
                     tuple(sorted(found, key=lambda t: (t != "O", t))))
      check_iob(self.labels, "data.labels" if given
                else f"data.train_file {paths['train']}")
      for split, (_, tags) in self._read.items():
        unknown = sorted({t for s in tags for t in s} - set(self.labels))
        if unknown:
          raise ValueError(f"data.{split}_file has tags {unknown} that are "
                           f"not in the tag set {list(self.labels)}; list "
                           "every tag in data.labels.")
    else:
      self._source = TfdsSource.from_data(data)
      self.eval_splits = ("validation",)
      self.predict_splits = ("validation", "test")
      self.labels = tag_names(self._source)
    if self.labels is not None and len(self.labels) < 2:
      raise ValueError(f"The tag set {list(self.labels)} has fewer than two "
                       "tags; tagging needs at least 'O' and one entity tag.")

  def _sentences(self, split: str):
    if self.name == "ner/files":
      if split not in self._read:
        raise ValueError(f"ner/files has no split {split!r}; choose one of "
                         f"{tuple(self._read)}.")
      return self._read[split]
    return read_tfds(split, self._source)

  def load(self, split: str, tokenizer, max_seq_length: int) -> Split:
    words, tags = self._sentences(split)
    features = encode_words(tokenizer, words, max_seq_length)
    first = features.pop("first")
    index = {t: i for i, t in enumerate(self.labels)}
    labels = np.full(first.shape, -1, np.int32)
    rows, cols = np.nonzero(first >= 0)
    labels[rows, cols] = [index[tags[r][first[r, c]]]
                          for r, c in zip(rows, cols)]
    features["labels"] = labels
    return Split(name=split, features=features,
                 examples=Sentences(words, tags, first))

  def batch_features(self, max_seq_length: int):
    """INPUT_KEYS and "labels" [T] int32 (a word's tag on its first
    sub-word, -1 elsewhere)."""
    return {**super().batch_features(max_seq_length),
            "labels": ((max_seq_length,), np.int32)}

  def head(self, model_config):
    if self.labels is None:
      raise ValueError("The conll2003 tag names come with its data; load a "
                       "split before building the head.")
    return TokenClassifierHead(model_config, len(self.labels))

  def loss_sums(self, outputs: dict, batch: dict) -> dict:
    """Per sentence, the mean cross entropy over its labelled sub-words (0
    for a sentence with none); "correct_sum" the fraction of them predicted
    right. A packed row's sentences are told apart by their segments."""
    logits = outputs["logits"]  # [N, T, L]
    labels = batch["labels"]  # [N, T]
    valid = (labels >= 0).astype(jnp.float32)
    nll = optax.softmax_cross_entropy_with_integer_labels(
        logits, jnp.maximum(labels, 0))
    right = (jnp.argmax(logits, -1) == labels).astype(jnp.float32) * valid
    slots = packing.token_slots(batch) * valid[..., None]  # [N, T, K]
    count = jnp.maximum(jnp.sum(slots, axis=1), 1.0)  # [N, K]
    loss = jnp.einsum("nt,ntk->nk", nll, slots) / count
    correct = jnp.einsum("nt,ntk->nk", right, slots) / count
    w = packing.example_weights(batch)
    w = w if w.ndim == 2 else w[:, None]  # [N, K]
    return {"loss_sum": jnp.sum(jnp.where(w > 0, loss, 0.0) * w),
            "correct_sum": jnp.sum(correct * w)}

  def predict(self, outputs: dict, batch: dict) -> dict[str, jax.Array]:
    del batch
    return {"tags": jnp.argmax(outputs["logits"], -1).astype(jnp.int32)}

  def _guessed(self, predictions: dict, split: Split) -> list[list[str]]:
    ex: Sentences = split.examples
    return word_tags(np.asarray(predictions["tags"]), ex.first,
                     [len(w) for w in ex.words], self.labels)

  def evaluate(self, predictions: dict, split: Split) -> dict[str, float]:
    scores = conlleval.evaluate(split.examples.tags,
                                self._guessed(predictions, split))
    return {k: scores[k] for k in ("precision", "recall", "f1", "accuracy")}

  def write_predictions(self, predictions: dict, split: Split,
                        directory: str) -> list[str]:
    ex: Sentences = split.examples
    guessed = self._guessed(predictions, split)
    lines = []
    for n, (words, tags) in enumerate(zip(ex.words, guessed)):
      gold = ex.tags[n] if ex.tags is not None else ["O"] * len(words)
      lines += [f"{w} {g} {p}\n" for w, g, p in zip(words, gold, tags)]
      lines.append("\n")
    path = storage.path(directory) / f"{split.name}_predictions.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    storage.write_atomic(path, "".join(lines))
    return [os.fspath(path)]

  def describe(self) -> dict:
    return {"task_type": "token_classification", "labels": list(self.labels)}


def make_task(name: str, data) -> TaggingTask:
  """The tagging task `name` ("ner/files" or "ner/conll2003")."""
  return TaggingTask(name, data)


def _tag_input(item) -> tuple[str, list[str], list[tuple[int, int]]]:
  """(text, words, word spans) of a tagging input: a text, or a dict with
  "text" or "tokens" (words, joined with spaces)."""
  if isinstance(item, dict) and isinstance(item.get("tokens"), list):
    words = [str(w) for w in item["tokens"]]
    text = " ".join(words)
    spans, at = [], 0
    for w in words:
      spans.append((at, at + len(w)))
      at += len(w) + 1
    return text, words, spans
  text = item.get("text") if isinstance(item, dict) else item
  if not isinstance(text, str):
    raise PredictError("A tagging input is a text, or a dict with 'text' or "
                       f"'tokens' (a list of words); got {item!r}.")
  words, spans = split_words(text)
  return text, words, spans


class TokenClassificationType(task_type_lib.TaskType):
  """A fine-tuned tagger: `TokenClassifierHead` on every token; its
  task.json "labels" are the tags."""
  name = "token_classification"
  labelled = True
  pooled = False
  head_layer = "classifier"
  hf_class = "ForTokenClassification"
  packable = True
  token_keys = ("logits",)

  def head(self, info: dict, cfg: ModelConfig) -> nn.Module:
    return TokenClassifierHead(cfg, len(info["labels"]))

  def predict(self, model, items: list, batch_size: int) -> list[dict]:
    parsed = [_tag_input(item) for item in items]
    features = encode_words(model.tokenizer, [p[1] for p in parsed],
                            model.max_seq_length)
    first = features.pop("first")
    logits = model(features, batch_size)["logits"]
    tags = word_tags(np.argmax(logits, -1), first,
                     [len(p[1]) for p in parsed], model.labels)
    return [{"entities": entities(text, spans, t), "words": words,
             "tags": t} for (text, words, spans), t in zip(parsed, tags)]

  def file_input(self, row: dict, settings: dict,
                 columns: Sequence[str] | None):
    """The text of `columns[0]`, else the row ("text" or "tokens")."""
    return {"text": row.get(columns[0])} if columns else row



TOKEN_CLASSIFICATION = TokenClassificationType()
