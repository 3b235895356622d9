"""`albert_jax.text.documents`: corpus files, raw text, JSONL and TFDS.

Small hand-written corpora on disk pin down the official format (blank-line
document boundaries, documents never spanning files, .gz, globs) and the
dirty-input rules: bad lines are skipped and counted with a warning while
the rest is read. TFDS runs on `tfds.testing.mock_data`, whose examples are
deterministic per index, so two hosts' slices can be compared with one
host's whole split.
"""

import gzip
import json
import logging
import os

import hypothesis
from hypothesis import strategies as st
import pytest

from albert_jax.text import documents as docs_lib

WIKI = "wikipedia/20230601.en"


def _write(path, text: str | bytes):
  data = text.encode("utf-8") if isinstance(text, str) else text
  opener = gzip.open if str(path).endswith(".gz") else open
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with opener(path, "wb") as f:
    f.write(data)
  return str(path)


@pytest.fixture
def corpus(tmp_path):
  """Three files: plain, gzipped, and in a subdirectory."""
  _write(tmp_path / "a.txt",
         "A one.\nA two.\n\n\n  \nB one.\n   B two, indented.   \n\nC only.\n")
  _write(tmp_path / "b.txt.gz", "\nD one.\r\nD two.\r\n")  # no final blank
  _write(tmp_path / "sub" / "c.txt", "E one.\n\nF one.\nF two.")
  return tmp_path


def test_official_format_documents(corpus):
  stats = docs_lib.ReadStats()
  paths = docs_lib.expand_paths([str(corpus / "*.txt*"),
                                 str(corpus / "sub" / "c.txt")])
  got = list(docs_lib.read_sentence_files(paths, stats))
  assert got == [["A one.", "A two."], ["B one.", "B two, indented."],
                 ["C only."], ["D one.", "D two."], ["E one."],
                 ["F one.", "F two."]]
  assert (stats.files, stats.documents, stats.sentences) == (3, 6, 10)
  assert stats.skipped == 0


def test_documents_never_span_files(tmp_path):
  # Neither file ends with a blank line, yet each is its own document.
  a = _write(tmp_path / "1.txt", "x one.\nx two.")
  b = _write(tmp_path / "2.txt.gz", "y one.\ny two.\n")
  assert list(docs_lib.read_sentence_files([a, b])) == [
      ["x one.", "x two."], ["y one.", "y two."]]


def test_expand_paths_globs_and_commas(corpus):
  got = docs_lib.expand_paths(f"{corpus}/*.txt, {corpus}/**/*.txt")
  # Sorted per pattern, a file matched twice listed once, dirs skipped.
  assert got == [f"{corpus}/a.txt", f"{corpus}/sub/c.txt"]
  assert docs_lib.expand_paths(f"{corpus}/*.gz") == [f"{corpus}/b.txt.gz"]


def test_expand_paths_no_match_names_pattern(corpus):
  with pytest.raises(FileNotFoundError, match=r"nothing\*\.txt"):
    docs_lib.expand_paths(f"{corpus}/*.txt,{corpus}/nothing*.txt")
  with pytest.raises(FileNotFoundError, match="No input"):
    docs_lib.expand_paths(" , ")


@pytest.mark.parametrize("suffix", [".txt", ".txt.gz"])
def test_bad_lines_skipped_counted_and_warned(tmp_path, caplog, suffix):
  limit = docs_lib.MAX_LINE_BYTES
  data = b"".join([
      "\ufeffGood one.\n".encode(),          # a BOM is dropped
      b"Bad \xff\xfe bytes.\n",               # not UTF-8
      b"Good two.\n",
      b"x" * (limit + 10) + b"\n",            # over the limit
      b"y" * limit + b"\n",                   # exactly the limit: kept
      b"\n",
      b"Good three.\n",
      b"z" * (3 * limit),                     # over, at EOF, no newline
  ])
  path = _write(tmp_path / f"dirty{suffix}", data)
  stats = docs_lib.ReadStats()
  with caplog.at_level(logging.WARNING, logger=docs_lib.__name__):
    got = list(docs_lib.read_sentence_files([path], stats))
  assert got == [["Good one.", "Good two.", "y" * limit], ["Good three."]]
  assert stats.skipped_non_utf8 == 1
  assert stats.skipped_long_lines == 2
  text = caplog.text
  assert (f"Skipping {path}:2: not valid UTF-8 (bytes b'\\xff' at byte 5)."
          in text)
  assert f"{path}:4" in text and "longer than" in text
  assert "Skipped 1 line(s) that are not UTF-8, 2 line(s) over" in text
  assert stats.skipped_files == 0


@pytest.mark.parametrize("name, data, expected", [
    ("bom16.txt.gz", "One.\nTwo.\n".encode("utf-16"),
     "{path} starts with the byte-order mark of UTF-16 (little-endian) "
     "text; albert_jax reads UTF-8. Re-save it as UTF-8, e.g. zcat "
     "bom16.txt.gz | iconv -f utf-16 -t utf-8 | gzip > bom16.utf8.txt.gz"),
    ("bom32.txt", "One.\n".encode("utf-32"),
     "{path} starts with the byte-order mark of UTF-32 (little-endian) "
     "text; albert_jax reads UTF-8. Re-save it as UTF-8, e.g. iconv -f "
     "utf-32le -t utf-8 bom32.txt > bom32.utf8.txt"),
    ("be16.txt", "One.\nTwo.\n".encode("utf-16-be"),
     "{path}, line 1, byte 1 (offset 0): NUL bytes beside the text, as "
     "UTF-16 without a byte-order mark writes it (or the file is not text); "
     "albert_jax reads UTF-8. Re-save it as UTF-8, e.g. iconv -f utf-16be "
     "-t utf-8 be16.txt > be16.utf8.txt"),
    ("le16.txt", "\nOne.\n".encode("utf-16-le"),
     "{path}, line 2, byte 1 (offset 1): NUL bytes beside the text, as "
     "UTF-16 without a byte-order mark writes it (or the file is not text); "
     "albert_jax reads UTF-8. Re-save it as UTF-8, e.g. iconv -f utf-16le "
     "-t utf-8 le16.txt > le16.utf8.txt"),
], ids=["utf16-bom-gz", "utf32-bom", "utf16be", "utf16le"])
def test_a_utf16_corpus_is_refused(tmp_path, name, data, expected):
  """Its lines after the first decode as "UTF-8" riddled with NULs: they
  would be trained on, not skipped."""
  path = _write(tmp_path / name, data)
  for read in (docs_lib.read_sentence_files, docs_lib.read_raw_files):
    with pytest.raises(ValueError) as e:
      list(read([path]))
    assert str(e.value) == expected.format(path=path)


def test_latin1_and_nul_lines_are_skipped_with_the_fix(tmp_path, caplog):
  path = _write(tmp_path / "c.txt",
                "Café one.\nPlain two.\n".encode("latin-1")
                + b"Bad\x00line.\nThree.\n")
  stats = docs_lib.ReadStats()
  with caplog.at_level(logging.WARNING, logger=docs_lib.__name__):
    got = list(docs_lib.read_sentence_files([path], stats))
  assert got == [["Plain two.", "Three."]]
  assert stats.skipped_non_utf8 == 2
  assert [r.getMessage() for r in caplog.records] == [
      f"Skipping {path}:1: not valid UTF-8 (bytes b'\\xe9' at byte 4).",
      f"Skipping {path}:3: not valid UTF-8 text (a NUL byte at byte 4).",
      f"Skipped 2 line(s) that are not UTF-8, 0 line(s) over "
      f"{docs_lib.MAX_LINE_BYTES} bytes, 0 unusable record(s) and the "
      "damaged end of 0 file(s); the rest of the corpus was read. A corpus "
      "in Latin-1 or Windows-1252 loses every line with an accent this way: "
      "convert it first, e.g. iconv -f latin1 -t utf-8 IN > OUT."]


def test_truncated_gzip_keeps_what_was_readable(tmp_path, caplog):
  text = "".join(f"Sentence {i} of doc {i // 3}.\n" + ("\n" if i % 3 == 2
                                                        else "")
                 for i in range(3000))
  whole = _write(tmp_path / "whole.txt.gz", text)
  with open(whole, "rb") as f:
    data = f.read()
  cut = str(tmp_path / "cut.txt.gz")
  with open(cut, "wb") as f:  # raw: half of a gzip stream
    f.write(data[:len(data) // 2])
  other = _write(tmp_path / "other.txt", "Next file.\nStill read.\n")
  stats = docs_lib.ReadStats()
  with caplog.at_level(logging.WARNING, logger=docs_lib.__name__):
    got = list(docs_lib.read_sentence_files([cut, other], stats))
  assert 10 < len(got) < 1000 and got[-1] == ["Next file.", "Still read."]
  assert got[0] == ["Sentence 0 of doc 0.", "Sentence 1 of doc 0.",
                    "Sentence 2 of doc 0."]
  assert stats.skipped_files == 1
  assert f"the rest of {cut}" in caplog.text


@pytest.mark.parametrize("text, expected", [
    ("Mr. Smith went to Washington. He arrived at 5 p.m. on Monday.",
     ["Mr. Smith went to Washington.", "He arrived at 5 p.m. on Monday."]),
    ("George W. Bush spoke. J. R. R. Tolkien wrote. Dr. Who? Yes.",
     ["George W. Bush spoke.", "J. R. R. Tolkien wrote.", "Dr. Who?",
      "Yes."]),
    ('"Hello," she said. "How are you?" He smiled. (It was late.) Then!',
     ['"Hello," she said.', '"How are you?"', "He smiled.",
      "(It was late.)", "Then!"]),
    ("See No. 5 and fig. 3 here. I said no. The U.S. Army came. 10 left.",
     ["See No. 5 and fig. 3 here.", "I said no.", "The U.S. Army came.",
      "10 left."]),
    ("One line\nwrapped here. Two.\n\nNew paragraph without stop\n \nLast",
     ["One line wrapped here.", "Two.", "New paragraph without stop",
      "Last"]),
    ("Wait... What? it goes on. e.g. this stays.",
     ["Wait...", "What? it goes on. e.g. this stays."]),
    ("\u6211\u4eec\u8d70\u5427\u3002\u4ed6\u8bf4\u597d\uff01",
     ["\u6211\u4eec\u8d70\u5427\u3002", "\u4ed6\u8bf4\u597d\uff01"]),
    ("... -- !!", []),
    ("", []),
])
def test_split_sentences(text, expected):
  assert docs_lib.split_sentences(text) == expected


def test_raw_files_one_document_each(tmp_path):
  a = _write(tmp_path / "a.txt", "First doc. It has two.\n\nAnd a para.\n")
  b = _write(tmp_path / "b.txt.gz", "Second doc here.")
  empty = _write(tmp_path / "c.txt", "  \n\n")
  stats = docs_lib.ReadStats()
  got = list(docs_lib.read_raw_files([a, b, empty], stats=stats))
  assert got == [["First doc.", "It has two.", "And a para."],
                 ["Second doc here."]]
  assert (stats.files, stats.documents, stats.sentences) == (3, 2, 4)


def test_jsonl_documents_and_bad_records(tmp_path, caplog):
  lines = [json.dumps({"text": "One. Two.", "id": 1}), "",
           "{not json", json.dumps({"text": None}), json.dumps([1, 2]),
           json.dumps({"text": "Three here."})]
  path = _write(tmp_path / "d.jsonl", "\n".join(lines) + "\n")
  stats = docs_lib.ReadStats()
  with caplog.at_level(logging.WARNING, logger=docs_lib.__name__):
    got = list(docs_lib.read_raw_files([path], "text", stats))
  assert got == [["One.", "Two."], ["Three here."]]
  assert stats.skipped_records == 3
  assert f"{path}:3" in caplog.text and "not valid JSON" in caplog.text


def test_jsonl_lone_surrogates_are_skipped_by_file_and_line(tmp_path,
                                                           caplog):
  """JSON's "\\ud800" decodes to half a UTF-16 pair: not text, and a
  SentencePiece failure deep in preparation. A pair is a character."""
  path = _write(tmp_path / "d.jsonl",
                '{"text": "Bad \\ud800 half."}\n'
                '{"text": "A pair \\ud83d\\ude00 is fine."}\n')
  stats = docs_lib.ReadStats()
  with caplog.at_level(logging.WARNING, logger=docs_lib.__name__):
    got = list(docs_lib.read_raw_files([path], "text", stats))
  assert got == [["A pair \U0001f600 is fine."]]
  assert stats.skipped_records == 1
  assert (f"Skipping {path}:1: field 'text': 'Bad \\ud800 half.' holds a "
          "lone UTF-16 surrogate (\\ud800), half of an escaped pair, which "
          "is not text." in caplog.text)


def test_jsonl_missing_field_names_file_and_line(tmp_path):
  path = _write(tmp_path / "d.jsonl", '{"text": "A. B."}\n{"body": "C."}\n')
  with pytest.raises(ValueError, match=rf"{path}:2 has no field 'text'.*"
                     r"\['body'\]"):
    list(docs_lib.read_raw_files([path], "text"))


@hypothesis.given(n=st.integers(0, 10_000), count=st.integers(1, 64),
                  data=st.data())
def test_host_range_partitions(n, count, data):
  ranges = [docs_lib.host_range(n, i, count) for i in range(count)]
  assert [i for r in ranges for i in r] == list(range(n))  # exact, in order
  sizes = [len(r) for r in ranges]
  assert max(sizes) - min(sizes) <= 1
  bad = data.draw(st.one_of(st.integers(-5, -1), st.integers(count, 99)))
  with pytest.raises(ValueError):
    docs_lib.host_range(n, bad, count)


def test_parse_tfds_spec():
  assert docs_lib.parse_tfds_spec(f"{WIKI}:text") == (WIKI, "text")
  assert docs_lib.parse_tfds_spec("c4/en") == ("c4/en", "text")
  with pytest.raises(ValueError, match="no dataset name"):
    docs_lib.parse_tfds_spec(":text")


def test_tfds_hosts_read_disjoint_slices_covering_all():
  tfds = pytest.importorskip("tensorflow_datasets")
  n = 11
  with tfds.testing.mock_data(num_examples=n):
    source = tfds.data_source(WIKI, split="train")
    texts = [source[i]["text"] for i in range(n)]
    hosts, stats = [], []
    for i in range(2):
      stats.append(docs_lib.ReadStats())
      hosts.append(list(docs_lib.read_tfds(
          f"{WIKI}:text", process_index=i, process_count=2,
          stats=stats[-1])))
    whole = list(docs_lib.read_tfds(f"{WIKI}:text"))
    with pytest.raises(ValueError, match="no feature 'body'.*'text'"):
      list(docs_lib.read_tfds(f"{WIKI}:body"))
  expected = [s for s in map(docs_lib.split_sentences, texts) if s]
  assert whole == expected
  assert hosts[0] + hosts[1] == whole  # together: every example, once
  assert [s.total_documents for s in stats] == [6, 5]
  # Disjoint: each host's documents are exactly its own contiguous slice.
  for i, host in enumerate(hosts):
    own = [texts[j] for j in docs_lib.host_range(n, i, 2)]
    assert host == [s for s in map(docs_lib.split_sentences, own) if s]


@pytest.fixture(scope="module")
def prose_builder():
  """A tiny local TFDS dataset class (registered once per process)."""
  tfds = pytest.importorskip("tensorflow_datasets")
  import numpy as np  # pylint: disable=g-import-not-at-top

  class AlbertJaxTestProse(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=(
          tfds.features.FeaturesDict({"text": tfds.features.Text(),
                                      "id": tfds.features.Scalar(np.int32)})))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i in range(13):
        yield i, {"text": f"Doc {i} starts. It ends.", "id": i}

  return AlbertJaxTestProse


@pytest.mark.parametrize("file_format", ["array_record", "tfrecord"])
def test_tfds_real_builder_partitions(tmp_path, prose_builder, file_format):
  """A real (tiny, local) dataset: random access for ArrayRecord, the
  `tfds.load` sub-split fallback for TFRecord; hosts partition it."""
  if file_format == "tfrecord":
    pytest.importorskip("tensorflow")
  prose_builder(data_dir=str(tmp_path),
                file_format=file_format).download_and_prepare()
  hosts = []
  for i in range(3):
    stats = docs_lib.ReadStats()
    hosts.append(list(docs_lib.read_tfds(
        "albert_jax_test_prose:text", process_index=i, process_count=3,
        data_dir=str(tmp_path), stats=stats)))
    assert stats.total_documents == len(docs_lib.host_range(13, i, 3))
    assert all(doc[1] == "It ends." for doc in hosts[-1])
  firsts = [doc[0] for host in hosts for doc in host]
  assert sorted(firsts) == sorted(f"Doc {i} starts." for i in range(13))
