"""Tokenizers loaded from, saved to and trained into gs:// (the Cloud Storage
emulator) are the local ones, byte for byte and id for id."""

import gzip
import itertools
import os

from locations import CORPUS
import ml_collections
import pytest

from albert_jax import storage
from albert_jax.text import run_tokenizer
from albert_jax.text import train_tokenizer as text_train
from albert_jax.text.tokenizer import Tokenizer

TEXTS = ["The quick brown fox jumps over the lazy dog!", "café naïve 9,000",
         "Fellow citizens of the Senate", "", "unknownword c'a'b"]
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown",
         "fox", "jump", "##s", "over", "lazy", "dog", "cafe", "naive", "c",
         "##a", "##b", "'", "!", ",", "9", "000"]


@pytest.fixture(scope="module")
def corpus_bytes() -> bytes:
  """Two hundred lines of the bundled corpus, gzipped."""
  with gzip.open(CORPUS, "rb") as f:
    return gzip.compress(b"".join(itertools.islice(f, 200)), mtime=0)


def _upload(local_dir, remote_dir: str) -> None:
  for name in sorted(os.listdir(local_dir)):
    with open(os.path.join(local_dir, name), "rb") as f:
      storage.write_atomic(f"{remote_dir}/{name}", f.read())


def _files(directory: str) -> dict[str, bytes]:
  """Name → bytes of the files in a local or gs:// directory."""
  return {p.name: p.read_bytes() for p in storage.path(directory).iterdir()}


def _without_prefix(model: bytes) -> bytes:
  """A SentencePiece model without the trainer's model_prefix."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  proto = sentencepiece_model_pb2.ModelProto.FromString(model)
  assert proto.trainer_spec.model_prefix
  proto.trainer_spec.ClearField("model_prefix")
  return proto.SerializeToString()


def _same(a: Tokenizer, b: Tokenizer) -> None:
  assert a.vocab_size == b.vocab_size
  assert (a.pad_id, a.unk_id, a.cls_id, a.sep_id, a.mask_id) == (
      b.pad_id, b.unk_id, b.cls_id, b.sep_id, b.mask_id)
  assert (a.do_lower_case, a.keep_accents) == (b.do_lower_case, b.keep_accents)
  for text in TEXTS:
    assert a.encode(text) == b.encode(text), text


def test_every_kind_loads_and_saves_on_gcs(gcs_bucket, tiny_spm, corpus_bytes,
                                           tmp_path):
  (tmp_path / "corpus.txt.gz").write_bytes(corpus_bytes)
  (tmp_path / "wp").mkdir()
  (tmp_path / "wp" / "vocab.txt").write_text("\n".join(WORDS) + "\n",
                                             encoding="utf-8")
  local = {
      "spm": Tokenizer.from_file(tiny_spm, do_lower_case=False),
      "wp": Tokenizer.from_file(tmp_path / "wp" / "vocab.txt"),
      "bpe": text_train.train(str(tmp_path / "corpus.txt.gz"), 300,
                              kind="bpe", output=tmp_path / "bpe"),
  }
  for kind, tok in local.items():
    # Saved to gs://, the same files as saved locally.
    saved = tok.save(f"{gcs_bucket}/{kind}")
    tok.save(tmp_path / "saved" / kind)
    assert _files(f"{gcs_bucket}/{kind}") == _files(tmp_path / "saved" / kind)
    main = {"spm": "spiece.model", "wp": "tokenizer.json",
            "bpe": "tokenizer.json"}[kind]
    assert saved == f"{gcs_bucket}/{kind}/{main}"
    # Loaded from gs://: the file, its directory, and find_in.
    from_gcs = Tokenizer.from_file(saved)
    assert from_gcs.path == saved
    _same(from_gcs, Tokenizer.from_file(tmp_path / "saved" / kind / main))
    _same(Tokenizer.from_file(f"{gcs_bucket}/{kind}"), tok)
    _same(Tokenizer.find_in(f"{gcs_bucket}/{kind}"), tok)
  assert not local["spm"].do_lower_case  # kept by tokenizer_config.json

  # The source files themselves: a bare .model, a BERT vocab.txt, and
  # vocab.json with merges.txt beside it.
  _upload(os.path.dirname(tiny_spm), f"{gcs_bucket}/src/spm")
  _upload(tmp_path / "wp", f"{gcs_bucket}/src/wp")
  _upload(tmp_path / "bpe", f"{gcs_bucket}/src/bpe")
  for local_path, remote in [
      (tiny_spm, f"{gcs_bucket}/src/spm/spiece.model"),
      (tmp_path / "wp" / "vocab.txt", f"{gcs_bucket}/src/wp/vocab.txt"),
      (tmp_path / "bpe" / "vocab.json", f"{gcs_bucket}/src/bpe/vocab.json"),
      (tmp_path / "bpe" / "merges.txt", f"{gcs_bucket}/src/bpe/merges.txt")]:
    _same(Tokenizer.from_file(remote), Tokenizer.from_file(local_path))

  storage.path(f"{gcs_bucket}/src/bpe/merges.txt").unlink()
  with pytest.raises(FileNotFoundError) as e:
    Tokenizer.from_file(f"{gcs_bucket}/src/bpe/vocab.json")
  assert str(e.value).startswith(
      f"{gcs_bucket}/src/bpe/merges.txt does not exist: a byte-level BPE")
  assert sorted(os.listdir(tmp_path)) == ["bpe", "corpus.txt.gz", "saved",
                                          "wp"]


def test_training_writes_to_gcs(gcs_bucket, corpus_bytes, tmp_path, capsys):
  storage.write_atomic(f"{gcs_bucket}/corpus/a.txt.gz", corpus_bytes)
  (tmp_path / "a.txt.gz").write_bytes(corpus_bytes)
  remote = text_train.train(f"{gcs_bucket}/corpus/*.gz", 300,
                            output=f"{gcs_bucket}/spm/spiece.model", seed=1,
                            num_threads=1)
  local = text_train.train(str(tmp_path / "*.gz"), 300,
                           output=tmp_path / "spm" / "spiece.model", seed=1,
                           num_threads=1)
  assert remote.path == f"{gcs_bucket}/spm/spiece.model"
  assert remote.train_stats["sentences"] == local.train_stats["sentences"]
  remote_files, local_files = _files(f"{gcs_bucket}/spm"), _files(
      tmp_path / "spm")
  assert sorted(remote_files) == ["spiece.model", "spiece.vocab"]
  assert remote_files["spiece.vocab"] == local_files["spiece.vocab"]
  # The model records where it was trained (a local temporary directory for
  # gs://); the rest is the same.
  assert _without_prefix(remote_files["spiece.model"]) == _without_prefix(
      local_files["spiece.model"])
  _same(remote, local)

  assert text_train.main(["--type", "bpe", "--input",
                          f"{gcs_bucket}/corpus/a.txt.gz", "--vocab_size",
                          "300", "--output", f"{gcs_bucket}/bpe"]) == 0
  assert capsys.readouterr().out.startswith(
      f"Wrote {gcs_bucket}/bpe/tokenizer.json: 300 pieces")
  text_train.train(str(tmp_path / "a.txt.gz"), 300, kind="bpe",
                   output=tmp_path / "bpe")
  assert _files(f"{gcs_bucket}/bpe") == _files(tmp_path / "bpe")
  assert sorted(_files(f"{gcs_bucket}/bpe")) == [
      "merges.txt", "tokenizer.json", "tokenizer_config.json", "vocab.json"]


@pytest.mark.parametrize("kind,main,files", [
    ("sentencepiece", "spm/spiece.model", ["spiece.model", "spiece.vocab"]),
    ("bpe", "bpe/tokenizer.json", ["merges.txt", "tokenizer.json",
                                   "tokenizer_config.json", "vocab.json"])])
def test_workdir_tokenizer_on_gcs(gcs_bucket, corpus_bytes, kind, main, files,
                                  monkeypatch):
  storage.write_atomic(f"{gcs_bucket}/corpus.txt.gz", corpus_bytes)
  config = ml_collections.ConfigDict(dict(
      seed=0, model=dict(vocab_size=300),
      data=dict(corpus=f"{gcs_bucket}/corpus.txt.gz", format="sentences",
                tokenizer="", tokenizer_type=kind)))
  workdir = f"{gcs_bucket}/run"
  tok = run_tokenizer.ensure(config.data, workdir,
                             vocab_size=config.model.vocab_size,
                             seed=config.seed)
  directory = main.split("/")[0]
  assert tok.path == f"{workdir}/{main}"
  assert sorted(_files(f"{workdir}/{directory}")) == files
  assert sorted(p.name for p in storage.path(workdir).iterdir()) == [directory]

  def no_training(*args, **kwargs):
    raise AssertionError("trained again")
  monkeypatch.setattr(text_train, "train", no_training)
  again = run_tokenizer.ensure(config.data, workdir,
                               vocab_size=config.model.vocab_size,
                               seed=config.seed)
  assert again.encode(TEXTS[0]) == tok.encode(TEXTS[0])
  assert run_tokenizer.find(config.to_dict(), workdir).path == tok.path

  config.data.tokenizer = f"{gcs_bucket}/none/spiece.model"
  with pytest.raises(FileNotFoundError) as e:
    run_tokenizer.ensure(config.data, workdir,
                         vocab_size=config.model.vocab_size,
                         seed=config.seed)
  assert str(e.value) == (
      f"config.data.tokenizer '{gcs_bucket}/none/spiece.model' does not "
      f"exist; {run_tokenizer.CONFIGURED_FIX}")
