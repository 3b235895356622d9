"""Byte-level BPE vocabularies (RoBERTa, GPT-2) through `tokenizers`.

A vocabulary loads from an HF `tokenizer.json` whose model is BPE behind a
ByteLevel pre-tokenizer, or from an HF RoBERTa directory's `vocab.json` +
`merges.txt`, rebuilt as transformers' `RobertaTokenizerFast` pipeline: no
normalisation, GPT-2's byte-to-symbol map and split regex without a prefix
space (so "Hello" and " Hello" are different pieces), the specials `<s>`
`<pad>` `</s>` `<unk>` `<mask>` matched in text, `<mask>` taking the space
before it (lstrip, as roberta-base's tokenizer.json has it), and offsets
trimmed of the space a piece carries. `save` writes the files transformers
loads, and `roberta_template` lays out RoBERTa's `<s> A </s></s> B </s>`.
Training one is `albert_jax.text.train_tokenizer.train_bpe` (the specials at ids
0..4; roberta-base has `<mask>` last, at 50264, and every id is looked up by
name).
The `tokenizers` library is imported on first use. Files are local or
`gs://` (`albert_jax.storage`).
"""

import json
import os
import tempfile
from typing import Any, Optional, Sequence

from albert_jax import storage
from albert_jax.text import local_copies
from albert_jax.text import wordpiece

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
# GPT-2's byte-level symbol for a space: the mark of a word-initial piece.
WORD_START = "\u0120"
# 256 byte symbols plus the specials: the smallest vocabulary there is.
MIN_VOCAB_SIZE = 256 + len(SPECIALS)
PAIR_FILES = ("vocab.json", "merges.txt")
_CONFIG = "tokenizer_config.json"
# Every file `save` writes, tokenizer.json last.
_FILES = ("vocab.json", "merges.txt", _CONFIG, "tokenizer.json")


def added_token(content: str):
  import tokenizers  # pylint: disable=g-import-not-at-top
  return tokenizers.AddedToken(content, lstrip=content == "<mask>",
                               rstrip=False, single_word=False,
                               normalized=False, special=True)


def _state(component) -> Any:
  """A pipeline component's settings as JSON (None for a missing one)."""
  return None if component is None else json.loads(component.__getstate__())


def _find_type(node: Any, name: str) -> Optional[dict]:
  """The first {"type": name, ...} inside a component's JSON (Sequences
  nest them)."""
  if isinstance(node, dict):
    if node.get("type") == name:
      return node
    node = list(node.values())
  if isinstance(node, list):
    for child in node:
      found = _find_type(child, name)
      if found is not None:
        return found
  return None


def is_byte_level(tok) -> bool:
  """Whether a `tokenizers.Tokenizer` is a BPE over byte-level symbols."""
  return (type(tok.model).__name__ == "BPE" and
          _find_type(_state(tok.pre_tokenizer), "ByteLevel") is not None)


def roberta_pipeline(model, add_prefix_space: bool = False,
                     trim_offsets: bool = True):
  """transformers' RobertaTokenizerFast pipeline around a BPE `model`.

  The specials of SPECIALS that the vocabulary holds are registered (so
  "<mask>" in text is one token); `<s> … </s>` templates and offset trimming
  come from a RobertaProcessing post-processor when it has `<s>` and `</s>`.
  """
  import tokenizers  # pylint: disable=g-import-not-at-top
  tok = tokenizers.Tokenizer(model)
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
      add_prefix_space=add_prefix_space)
  tok.decoder = tokenizers.decoders.ByteLevel()
  tok.add_special_tokens([added_token(s) for s in SPECIALS
                          if tok.token_to_id(s) is not None])
  cls_id, sep_id = tok.token_to_id("<s>"), tok.token_to_id("</s>")
  if cls_id is not None and sep_id is not None:
    tok.post_processor = tokenizers.processors.RobertaProcessing(
        ("</s>", sep_id), ("<s>", cls_id), trim_offsets=trim_offsets,
        add_prefix_space=add_prefix_space)
  return tok


def from_vocab_and_merges(path: str):
  """The pipeline of an HF RoBERTa directory's vocab.json + merges.txt.

  Args:
    path: either file; the other must be beside it. A tokenizer_config.json
      there may set `add_prefix_space` and `trim_offsets` (default False and
      True, as transformers has them).
  """
  import tokenizers  # pylint: disable=g-import-not-at-top
  directory = storage.path(storage.as_str(path)).parent
  vocab, merges = (os.fspath(directory / n) for n in PAIR_FILES)
  missing = [p for p in (vocab, merges) if not storage.path(p).is_file()]
  if missing:
    raise FileNotFoundError(
        f"{missing[0]} does not exist: a byte-level BPE vocabulary needs "
        "vocab.json and merges.txt side by side (an HF RoBERTa or GPT-2 "
        "directory holds both), or one tokenizer.json.")
  config = {}
  if (directory / _CONFIG).is_file():
    config = json.loads((directory / _CONFIG).read_text(encoding="utf-8"))
  try:
    with local_copies.local_files([vocab, merges]) as (local_vocab, local_merges):
      model = tokenizers.models.BPE.from_file(
          local_vocab, local_merges, continuing_subword_prefix="",
          end_of_word_suffix="", fuse_unk=False)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"{vocab} and {merges} are not a BPE vocabulary and "
                     f"merge list ({e}).") from e
  return roberta_pipeline(model, bool(config.get("add_prefix_space", False)),
                          bool(config.get("trim_offsets", True)))


def vocabulary_info(tok, pieces: Sequence[str]):
  """(pad_id, unk_id, special_ids, starts) of a byte-level vocabulary.

  Ids are None when absent; `special_ids` is the set of added special
  tokens; `starts` has one bool a piece: True for pieces that begin with
  the space symbol "Ġ" (what fairseq's whole-word masking uses). Such a
  vocabulary marks no other word boundary, so a text's first word (which has
  no space before it) continues whatever precedes it.
  """
  special = {i for i, t in tok.get_added_tokens_decoder().items()
             if t.special}
  return (tok.token_to_id("<pad>"), tok.token_to_id("<unk>"), special,
          [p.startswith(WORD_START) for p in pieces])


def roberta_template(ids_a: list, ids_b: Optional[list], cls_id: int,
                     sep_id: int, max_length: Optional[int] = None) -> dict:
  """`<s> a </s>` or `<s> a </s></s> b </s>`, as RobertaTokenizerFast.

  Pairs longer than `max_length` are cut with the tokenizers library's
  LongestFirst strategy. Returns "input_ids", "token_type_ids" (all 0:
  RoBERTa has a single token type) and "attention_mask", lists of equal
  length <= max_length.
  """
  if max_length is not None:
    n_special = 2 if ids_b is None else 4
    if max_length < n_special:
      raise ValueError(f"max_length={max_length} < {n_special} special "
                       "tokens.")
    budget = max_length - n_special
    if ids_b is None:
      ids_a = ids_a[:budget]
    else:
      n_a, n_b = wordpiece.longest_first(len(ids_a), len(ids_b), budget)
      ids_a, ids_b = ids_a[:n_a], ids_b[:n_b]
  ids = [cls_id] + ids_a + [sep_id]
  if ids_b is not None:
    ids += [sep_id] + ids_b + [sep_id]
  return {"input_ids": ids, "token_type_ids": [0] * len(ids),
          "attention_mask": [1] * len(ids)}


def save(tok, directory: str | os.PathLike) -> str:
  """Writes tokenizer.json, vocab.json, merges.txt and tokenizer_config.json.

  transformers' AutoTokenizer and RobertaTokenizerFast load the directory
  (from tokenizer.json; vocab.json + merges.txt serve loaders that read
  those). `directory` is local or `gs://`; tokenizer.json goes last, so its
  presence means the set is whole. Returns the tokenizer.json path.

  Raises:
    OSError: a write failed (a full disk, a folder not writable), in one
      line naming the folder; the files this save added are removed (files
      it replaced stay, each whole: every write is atomic).
  """
  directory = storage.path(directory)
  existed = {n for n in _FILES if (directory / n).exists()}
  written = []  # names this save writes into `directory`
  try:
    return _save(tok, directory, written)
  except OSError as e:
    for name in set(written) - existed:
      (directory / name).unlink(missing_ok=True)
    raise OSError(
        f"Writing the BPE tokenizer into {directory} failed "
        f"({e.strerror or e}): the disk is full, or the folder is not "
        "writable. Free space there (or choose another folder) and run "
        "again; no partial tokenizer is left.") from e


def _save(tok, directory, written: list[str]) -> str:
  """`save`'s writes, each file's name added to `written` before it is
  written."""
  directory.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(prefix="albert_jax_") as tmp:
    try:
      tok.model.save(tmp)  # vocab.json, merges.txt; only to a local folder
    except Exception as e:  # pylint: disable=broad-except
      # The tokenizers library raises a bare Exception("… (os error N)").
      if "os error" not in str(e):
        raise
      raise OSError(str(e)) from e
    written += sorted(os.listdir(tmp))
    local_copies.publish(tmp, directory)
  level = _find_type(_state(tok.pre_tokenizer), "ByteLevel") or {}
  post = _state(tok.post_processor)
  processor = _find_type(post, "RobertaProcessing")
  # Offsets are trimmed (or not) by the post-processor.
  trims = processor or _find_type(post, "ByteLevel") or {}
  config = {"add_prefix_space": bool(level.get("add_prefix_space", False)),
            "trim_offsets": bool(trims.get("trim_offsets", True)),
            "errors": "replace"}
  names = {"bos_token": "<s>", "eos_token": "</s>", "cls_token": "<s>",
           "sep_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
  config.update({k: v for k, v in names.items()
                 if tok.token_to_id(v) is not None})
  mask = tok.get_added_tokens_decoder().get(tok.token_to_id("<mask>"))
  if mask is not None:  # as registered: roberta-base's takes the space
    config["mask_token"] = {"__type": "AddedToken", "content": "<mask>",
                            "lstrip": mask.lstrip, "rstrip": mask.rstrip,
                            "normalized": False, "single_word": False,
                            "special": True}
  if processor is not None:
    config["tokenizer_class"] = "RobertaTokenizer"
  written.append(_CONFIG)
  storage.write_atomic(directory / _CONFIG, json.dumps(config, indent=2))
  out = directory / "tokenizer.json"
  written.append(out.name)
  # What `tok.save(out)` writes, which takes only a local name.
  storage.write_atomic(out, tok.to_str(pretty=True))
  return os.fspath(out)
