"""`albert_jax.data.prepare`: corpus → ArrayRecord shards + dataset.json.

End to end on a slice of the bundled corpus: the CLI once in a subprocess
(two worker processes), then `prepare()` in-process with one worker, which
must write byte-identical shards. Synthetic documents that name themselves
("doc 17 ...") show the eval split holds whole documents, disjoint from
train, chosen by `is_eval_document`.
"""

import dataclasses
import gzip
import io
import itertools
import json
import os
import re
import subprocess
import sys

from array_record.python import array_record_module
from locations import CORPUS
import numpy as np
import pytest

from albert_jax.text import documents as docs_lib
from albert_jax.data import instances as inst_lib
from albert_jax.data import prepare as prep
from albert_jax.data import shards
from albert_jax.data import units as units_lib
from albert_jax.text import train_tokenizer as text_train

BUNDLED = CORPUS.parent  # the bundled corpus's files
SEQ = 64


def _bundled_lines(name, n):
  with gzip.open(BUNDLED / name, "rt", encoding="utf-8") as f:
    return list(itertools.islice(f, n))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """~2,400 lines (≈40 documents) of two bundled files, gzipped, in a dir."""
  d = tmp_path_factory.mktemp("corpus")
  for name in ("moby_dick.txt.gz", "python_docs.txt.gz"):
    with gzip.open(d / name, "wt", encoding="utf-8") as f:
      f.writelines(_bundled_lines(name, 1200))
  return d


@pytest.fixture(scope="module")
def tok(corpus, tmp_path_factory):
  out = tmp_path_factory.mktemp("spm") / "spm.model"
  return text_train.train(str(corpus / "*.gz"), 800, output=out, seed=3,
                          num_threads=2)


def _records(path):
  reader = array_record_module.ArrayRecordReader(str(path))
  try:
    return reader.read_all()
  finally:
    reader.close()


def _config(tok, out, **kw):
  kw = {"max_seq_length": SEQ, "docs_per_block": 8, "eval_fraction": 0.15,
        "seed": 7, **kw}
  return prep.PrepareConfig(tokenizer=tok.path, output_dir=str(out), **kw)


def _run(docs, config, **kw):
  return prep.prepare(iter(docs), config, progress=None, **kw)


@pytest.fixture(scope="module")
def cli_run(corpus, tok, tmp_path_factory):
  out = tmp_path_factory.mktemp("cli")
  cmd = [sys.executable, "-m", "albert_jax.data.prepare",
         f"--input={corpus}/moby*.gz,{corpus}/python*.gz",
         f"--tokenizer={tok.path}", f"--output_dir={out}",
         f"--max_seq_length={SEQ}", "--docs_per_block=8",
         "--eval_fraction=0.15", "--seed=7", "--num_workers=2"]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                        check=False)
  assert proc.returncode == 0, proc.stderr
  return out, proc


def test_cli_writes_dataset(cli_run, tok):
  out, proc = cli_run
  with open(out / "dataset.json", encoding="utf-8") as f:
    meta = json.load(f)
  assert meta["format"] == prep.FORMAT
  assert meta["vocab_size"] == tok.vocab_size == 800
  assert meta["max_seq_length"] == SEQ and meta["objective"] == "sop"
  assert meta["config"]["num_workers"] == 2
  assert meta["read"]["files"] == 2 and meta["read"]["skipped_non_utf8"] == 0
  train, ev = meta["splits"]["train"], meta["splits"]["eval"]
  assert train["documents"] > 25 and ev["documents"] > 0
  assert train["documents"] + ev["documents"] == meta["read"]["documents"]
  assert len(train["files"]) == -(-train["documents"] // 8)  # 8 docs a shard
  on_disk = sorted(p for p in os.listdir(out) if p.endswith(".arrayrecord"))
  assert on_disk == sorted(train["files"] + ev["files"])
  for split in (train, ev):
    records = [r for f in split["files"] for r in _records(out / f)]
    assert len(records) == split["instances"] > 0
    tokens = 0
    for r in records:
      inst = inst_lib.from_bytes(r)
      n = len(inst.tokens)
      tokens += n
      assert n <= SEQ and inst.label in (0, 1)
      assert inst.tokens[0] == tok.cls_id and inst.tokens[-1] == tok.sep_id
      assert (inst.tokens == tok.sep_id).sum() == 2
      assert inst.token_type_ids[0] == 0 and inst.token_type_ids[-1] == 1
    assert tokens == split["tokens"]
  # The closing table shows the metadata's numbers.
  rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()
          if line.split() and line.split()[0] in ("train", "eval")}
  for name, s in meta["splits"].items():
    padding = 1 - s["tokens"] / (s["instances"] * SEQ)
    assert rows[name][1:6] == [f"{s['documents']:,}", f"{s['sentences']:,}",
                               f"{s['instances']:,}", f"{s['tokens']:,}",
                               f"{padding:.1%}"]
  assert "documents" in proc.stderr and "instances" in proc.stderr  # progress


def test_worker_count_does_not_change_output(cli_run, corpus, tok, tmp_path):
  out2, _ = cli_run
  paths = docs_lib.expand_paths(f"{corpus}/moby*.gz,{corpus}/python*.gz")
  meta = _run(docs_lib.read_sentence_files(paths), _config(
      tok, tmp_path, num_workers=1))
  with open(out2 / "dataset.json", encoding="utf-8") as f:
    meta2 = json.load(f)
  assert meta["splits"] == meta2["splits"]
  for split in meta["splits"].values():
    for name in split["files"]:
      assert _records(tmp_path / name) == _records(out2 / name), name


def _self_naming_docs(n, rng):
  """Document d: 2-5 sentences, each saying 'doc d line k'."""
  return [[f"Doc {d} line {k} tells of the whale."
           for k in range(int(rng.integers(2, 6)))] for d in range(n)]


def _docs_in(out, files, tok):
  """For each instance: the set of document numbers its text names."""
  found = []
  for name in files:
    for r in _records(out / name):
      text = tok.decode(inst_lib.from_bytes(r).tokens)
      found.append({int(m) for m in re.findall(r"doc (\d+) line", text)})
  return found


def test_eval_split_holds_whole_documents(tok, tmp_path):
  docs = _self_naming_docs(120, np.random.default_rng(0))
  meta = _run(docs, _config(tok, tmp_path, eval_fraction=0.25, dupe_factor=2))
  expect_eval = {d for d in range(120) if shards.is_eval_document(d, 0.25)}
  assert 10 < len(expect_eval) < 50
  per_split = {}
  for split, s in meta["splits"].items():
    found = _docs_in(tmp_path, s["files"], tok)
    assert all(len(f) == 1 for f in found)  # SOP never mixes documents
    per_split[split] = set().union(*found)
  assert per_split["eval"] == expect_eval
  assert per_split["train"] == set(range(120)) - expect_eval
  assert meta["splits"]["eval"]["documents"] == len(expect_eval)


def test_bad_lines_are_skipped_and_reported(corpus, tok, tmp_path):
  dirty = tmp_path / "dirty.txt"
  lines = _bundled_lines("moby_dick.txt.gz", 300)
  lines[5] = "broken \udcff line\n"
  lines[9] = "x" * (docs_lib.MAX_LINE_BYTES + 1) + "\n"
  dirty.write_bytes("".join(lines).encode("utf-8", "surrogateescape"))
  stats = docs_lib.ReadStats()
  meta = _run(docs_lib.read_sentence_files([str(dirty)], stats),
              _config(tok, tmp_path / "out", eval_fraction=0.0),
              read_stats=stats)
  assert meta["read"]["skipped_non_utf8"] == 1
  assert meta["read"]["skipped_long_lines"] == 1
  assert meta["splits"]["train"]["sentences"] == 298 - lines.count("\n")
  assert "1 non-UTF-8 lines, 1 over-long lines" in prep.summary(meta)


def test_empty_corpus_is_a_clear_error(tok, tmp_path, capsys):
  empty = tmp_path / "empty.txt"
  empty.write_text("\n  \n\n", encoding="utf-8")
  out = tmp_path / "out"
  code = prep.main([f"--input={empty}", f"--tokenizer={tok.path}",
                    f"--output_dir={out}"])
  err = capsys.readouterr().err
  assert code == 2
  assert "Nothing to train on" in err and str(empty) in err
  assert not os.path.exists(out / "dataset.json")
  code = prep.main([f"--input={tmp_path}/nope*.txt", f"--tokenizer={tok.path}",
                    f"--output_dir={out}"])
  assert code == 2 and "No files match" in capsys.readouterr().err


def test_single_sentence_documents(tok, tmp_path):
  docs = [[f"Only sentence number {i} is here."] for i in range(30)]
  with pytest.raises(ValueError, match=r"all 30 documents of corpus\.txt.*"
                     r"at least 2 sentences.*--objective=none"):
    _run(docs, _config(tok, tmp_path / "sop"), source="corpus.txt")
  # No half-written shards are left behind.
  assert not [p for p in os.listdir(tmp_path / "sop")]
  # Mixed in with real documents they are skipped and counted.
  mixed = docs[:5] + _self_naming_docs(10, np.random.default_rng(1))
  meta = _run(mixed, _config(tok, tmp_path / "mixed", eval_fraction=0.0))
  assert meta["splits"]["train"]["skipped_documents"] == 5
  assert meta["splits"]["train"]["instances"] > 0
  # The objective that needs no sentence pairs takes them.
  meta = _run(docs, _config(tok, tmp_path / "none", objective="none"))
  assert meta["splits"]["train"]["instances"] > 0


@pytest.mark.parametrize("objective", ["none", "nsp"])
def test_other_objectives(objective, tok, tmp_path):
  docs = _self_naming_docs(60, np.random.default_rng(2))
  meta = _run(docs, _config(tok, tmp_path, objective=objective,
                            eval_fraction=0.0))
  assert meta["objective"] == objective
  labels, seps = [], []
  for name in meta["splits"]["train"]["files"]:
    for r in _records(tmp_path / name):
      inst = inst_lib.from_bytes(r)
      assert len(inst.tokens) <= SEQ and inst.tokens[0] == tok.cls_id
      labels.append(inst.label)
      seps.append(int((inst.tokens == tok.sep_id).sum()))
      if objective == "none":
        assert not inst.token_type_ids.any()
  if objective == "none":
    assert set(labels) == {-1}
    # Packing crosses document boundaries, with a [SEP] between documents.
    found = _docs_in(tmp_path, meta["splits"]["train"]["files"], tok)
    assert max(map(len, found)) >= 2 and max(seps) >= 2
  else:
    assert set(labels) == {0, 1} and set(seps) == {2}


def test_rerun_with_other_parameters_is_refused_or_replaces(tok, tmp_path):
  docs = _self_naming_docs(40, np.random.default_rng(3))
  _run(docs, _config(tok, tmp_path, docs_per_block=4))
  with pytest.raises(ValueError, match=r"other parameters \(changed: "
                     r"recipe.docs_per_block;.*--overwrite"):
    _run(docs, _config(tok, tmp_path, docs_per_block=100))
  meta = _run(docs, _config(tok, tmp_path, docs_per_block=100),
              overwrite=True)
  on_disk = sorted(p for p in os.listdir(tmp_path)
                   if p.endswith(".arrayrecord"))
  assert on_disk == sorted(meta["splits"]["train"]["files"]
                           + meta["splits"]["eval"]["files"])
  assert os.listdir(tmp_path / "units") == ["unit-00000.json"]


def test_blocks_stream_lazily():
  def endless():
    for i in itertools.count():
      yield [f"Sentence {i}.", "Another."]
  config = prep.PrepareConfig("unused", "unused", docs_per_block=3)
  split, block, first, docs = next(shards.document_blocks(
      endless(), config.eval_fraction, config.docs_per_block))
  assert (split, block, first, len(docs)) == ("train", 0, 0, 3)


def test_tfds_input_with_progress_eta(tok, tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  stats, bar = docs_lib.ReadStats(), io.StringIO()
  with tfds.testing.mock_data(num_examples=40):
    docs = prep.open_documents("wikipedia/20230601.en:text", "tfds", stats)
    meta = prep.prepare(docs, _config(tok, tmp_path, objective="none",
                                      eval_fraction=0.0, docs_per_block=10),
                        stats, progress=bar)
  assert stats.total_documents == 40
  assert meta["splits"]["train"]["documents"] == stats.documents > 30
  assert "100% of 40, ETA 0s" in bar.getvalue()


def test_bad_config_and_format(tok, tmp_path):
  with pytest.raises(ValueError, match="objective"):
    _run([], _config(tok, tmp_path, objective="mlm"))
  with pytest.raises(ValueError, match="eval_fraction"):
    _run([], _config(tok, tmp_path, eval_fraction=1.0))
  with pytest.raises(ValueError, match="Unknown --format 'csv'"):
    prep.open_documents("x", "csv", docs_lib.ReadStats())
  assert dataclasses.replace(_config(tok, tmp_path)).num_workers == 1


_PEAK_RSS = """
import resource, sys
from albert_jax.data import prepare
from albert_jax.text.tokenizer import Tokenizer
Tokenizer.from_file(sys.argv[1])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
code = prepare.main(sys.argv[2:])
print("KIB", before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def test_peak_memory_is_bounded_by_the_block_not_the_corpus(tiny_spm,
                                                             tmp_path):
  # 1.5 MB of text in blocks of 2 documents (~90 KB). Holding the corpus,
  # its tokens and its instances at once would add ~8 MB to the peak (as
  # --docs_per_block=100000 does); streaming block by block adds ~nothing.
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    text = f.read(1_500_000)
  (tmp_path / "corpus.txt").write_text(text[:text.rindex("\n\n")],
                                       encoding="utf-8")
  proc = subprocess.run(
      [sys.executable, "-c", _PEAK_RSS, tiny_spm,
       f"--input={tmp_path}/corpus.txt", f"--tokenizer={tiny_spm}",
       f"--output_dir={tmp_path}/out", "--docs_per_block=2",
       "--max_seq_length=64"],
      capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr
  before, peak = map(int, proc.stdout.split("KIB")[1].split())
  meta = json.loads((tmp_path / "out" / "dataset.json").read_text())
  assert meta["read"]["documents"] > 30
  assert peak - before < 4 * 1024, (before, peak)  # KiB


@pytest.mark.parametrize("pack", [0, 3])
def test_a_finished_unit_checks_out_whether_packed_or_not(pack, tok,
                                                          tmp_path):
  """A unit's record counts its shards' records (packed rows or instances),
  so a rerun keeps it rather than preparing it again."""
  docs = _self_naming_docs(40, np.random.default_rng(3))
  meta = _run(docs, _config(tok, tmp_path, docs_per_block=4, pack=pack))
  record = units_lib.finished(str(tmp_path), 0)
  assert record is not None
  shards = record["splits"]["train"]["shards"]
  rows = sum(s["records"] for s in shards)
  assert rows == meta["splits"]["train"]["rows"] == sum(
      len(_records(tmp_path / s["name"])) for s in shards)
  instances = sum(s["instances"] for s in shards)
  assert (rows < instances) if pack else (rows == instances)
