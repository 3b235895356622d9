"""BERT WordPiece and other `tokenizers`-library vocabularies.

`Tokenizer` holds one of these (a `tokenizers.Tokenizer`) for `vocab.txt`
(rebuilt as transformers' BertTokenizerFast pipeline) and for HF
`tokenizer.json` files, which may hold a WordPiece, Unigram or BPE model (a
byte-level BPE, RoBERTa's or GPT-2's, gets `albert_jax.text.bpe`'s handling).
The `tokenizers` library is imported on first use. The `[CLS] a [SEP] b
[SEP]` template with that library's longest-first truncation, which every
vocabulary's `encode_pair` uses, is ported here too. Files are local or
`gs://` (`albert_jax.storage`).
"""

import os
from typing import Callable, Optional, Sequence

from albert_jax import storage
from albert_jax.text import local_copies

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def bert_wordpiece(vocab_file: str, do_lower_case: bool, keep_accents: bool):
  """The pipeline of transformers' BertTokenizerFast, minus its templates."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  tok = tokenizers.Tokenizer(
      tokenizers.models.WordPiece.from_file(vocab_file, unk_token="[UNK]"))
  # strip_accents=None means "as lowercase", BERT's (and HF's) default.
  tok.normalizer = tokenizers.normalizers.BertNormalizer(
      lowercase=do_lower_case, strip_accents=False if keep_accents else None)
  tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
  tok.decoder = tokenizers.decoders.WordPiece()
  # Registered so "[MASK]" in text is one token, as in HF.
  tok.add_special_tokens([t for t in SPECIALS if tok.token_to_id(t)
                          is not None])
  return tok


def _check_vocab_lines(path: str) -> None:
  """A piece on two lines leaves an id with no piece: refuse it by name. A
  file without the "[UNK]" line is not a WordPiece vocabulary (a text file
  of any lines would otherwise load as one): refuse it too."""
  seen: dict[str, int] = {}
  with storage.path(path).open("r", encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      piece = line.rstrip("\n")
      if piece in seen:
        raise ValueError(
            f"{path}: the piece {piece!r} is on line {seen[piece]} and again "
            f"on line {number}; a vocab.txt lists each piece once (its line "
            "number is its id). Remove the repeated line.")
      seen[piece] = number
  if "[UNK]" not in seen:
    raise ValueError(
        f"{path} is not a WordPiece vocab.txt: no line is \"[UNK]\", which "
        "every BERT vocabulary has. Give a tokenizer's vocab.txt (or its "
        "spiece.model / tokenizer.json).")


def load(path: str, do_lower_case: bool, keep_accents: bool):
  """A `tokenizer.json`, or a BERT `vocab.txt` with these flags.

  A tokenizer.json may switch on fixed-length padding and truncation (HF
  sentence-transformers exports pad every text to 128); `encode` must give
  the text's own ids, so both are switched off.
  """
  if path.endswith(".txt"):
    _check_vocab_lines(path)
    with local_copies.local_files([path]) as (local,):
      return bert_wordpiece(local, do_lower_case, keep_accents)
  import tokenizers  # pylint: disable=g-import-not-at-top
  tok = tokenizers.Tokenizer.from_str(
      storage.path(path).read_text(encoding="utf-8"))
  tok.no_padding()
  tok.no_truncation()
  return tok


def vocabulary_info(wp, pieces: Sequence[str],
                    start_rule: Callable[[str], bool]):
  """Special ids and word-start flags of a `tokenizers` vocabulary.

  Args:
    wp: the `tokenizers.Tokenizer`.
    pieces: its pieces in id order.
    start_rule: word-start test for non-WordPiece models (a Unigram/BPE
      tokenizer.json has no "##" continuation marks).

  Returns:
    (pad_id, unk_id, special_ids, starts): ids are None when absent;
    `special_ids` is the set of added special tokens; `starts` one bool a
    piece.
  """
  def find(*names: str) -> Optional[int]:
    return next((wp.token_to_id(n) for n in names
                 if wp.token_to_id(n) is not None), None)
  # tokenizer.json may also hold an ALBERT-style Unigram (<pad>, <unk>).
  pad_id, unk_id = find("[PAD]", "<pad>"), find("[UNK]", "<unk>")
  special = {i for i, t in wp.get_added_tokens_decoder().items() if t.special}
  if type(wp.model).__name__ == "WordPiece":
    starts = [not p.startswith("##") for p in pieces]
  else:
    starts = [start_rule(p) for p in pieces]
  return pad_id, unk_id, special, starts


def bert_template(ids_a: list, ids_b: Optional[list], cls_id: int,
                  sep_id: int, max_length: Optional[int] = None) -> dict:
  """`[CLS] a [SEP] (b [SEP])`, as the tokenizers library's BERT template.

  Pairs longer than `max_length` are cut with its LongestFirst strategy.
  Returns "input_ids", "token_type_ids" (0 up to the first [SEP], then 1)
  and "attention_mask" as lists of equal length <= max_length.
  """
  if max_length is not None:
    n_special = 2 if ids_b is None else 3
    if max_length < n_special:
      raise ValueError(f"max_length={max_length} < {n_special} special "
                       "tokens.")
    budget = max_length - n_special
    if ids_b is None:
      ids_a = ids_a[:budget]
    else:
      n_a, n_b = longest_first(len(ids_a), len(ids_b), budget)
      ids_a, ids_b = ids_a[:n_a], ids_b[:n_b]
  ids = [cls_id] + ids_a + [sep_id]
  types = [0] * len(ids)
  if ids_b is not None:
    ids += ids_b + [sep_id]
    types += [1] * (len(ids_b) + 1)
  return {"input_ids": ids, "token_type_ids": types,
          "attention_mask": [1] * len(ids)}


def longest_first(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
  """Kept lengths of a pair under the tokenizers library's LongestFirst.

  A port of its truncation (what HF's tokenizers do for pairs): the budget
  is split so the shorter side keeps all it can; on ties the odd token goes
  to the longer side.
  """
  if len_a + len_b <= budget:
    return len_a, len_b
  n1, n2 = sorted((len_a, len_b))
  n2 = n1 if n1 > budget else max(n1, budget - n1)
  if n1 + n2 > budget:
    n1, n2 = budget // 2, budget // 2 + budget % 2
  return (n2, n1) if len_a > len_b else (n1, n2)


def save(wp, directory: str | os.PathLike, pieces: Sequence[str]) -> str:
  """Writes tokenizer.json and a vocab.txt beside it into `directory` (local
  or `gs://`, which exists); returns the json path."""
  directory = storage.path(directory)
  storage.write_atomic(directory / "vocab.txt", "".join(p + "\n"
                                                        for p in pieces))
  out = directory / "tokenizer.json"
  # What `wp.save(out)` writes, which takes only a local name.
  storage.write_atomic(out, wp.to_str(pretty=True))
  return os.fspath(out)
