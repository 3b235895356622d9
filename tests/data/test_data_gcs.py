"""Corpora, prepared data and the loader on gs:// (the Cloud Storage
emulator) give exactly what the same local files give."""

import gzip
import http.server
import itertools
import os
import re
import threading

from locations import CORPUS
import ml_collections
import numpy as np
import pytest

from albert_jax import storage
from albert_jax.text import documents
from albert_jax.data import loader as loader_lib
from albert_jax.data import shards
from albert_jax.data import masking
from albert_jax.data import pipeline
from albert_jax.data import prepare
from albert_jax.data import units
from albert_jax.training import defaults

SEQ = 32


def _corpus_files(lines: list[str]) -> dict[str, bytes]:
  """Two corpus files, one gzipped, with documents of six sentences."""
  docs = ["\n".join(lines[i:i + 6]) + "\n\n" for i in range(0, len(lines), 6)]
  half = len(docs) // 2
  return {"part-0.txt.gz": gzip.compress("".join(docs[:half]).encode(),
                                         mtime=0),
          "part-1.txt": "".join(docs[half:]).encode()}


@pytest.fixture(scope="module")
def corpus_files() -> dict[str, bytes]:
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    lines = [line.strip() for line in itertools.islice(f, 300) if line.strip()]
  return _corpus_files(lines)


def _put(root: str, files: dict[str, bytes]) -> None:
  storage.path(root).mkdir(parents=True, exist_ok=True)
  for name, data in files.items():
    storage.write_atomic(storage.path(root) / name, data)


def _prepare_cli(corpus_glob: str, tokenizer: str, output_dir: str,
                 num_workers: int = 1) -> None:
  assert prepare.main([
      f"--input={corpus_glob}", f"--tokenizer={tokenizer}",
      f"--output_dir={output_dir}", f"--max_seq_length={SEQ}",
      "--docs_per_block=8", "--eval_fraction=0.2", "--seed=3",
      f"--num_workers={num_workers}"]) == 0


def _loader(data_dir: str, tokenizer, split: str) -> loader_lib.Loader:
  return loader_lib.Loader(
      data_dir, split, global_batch_size=8,
      vocab=loader_lib.Vocabulary.from_tokenizer(tokenizer), seed=4,
      masking_config=masking.MaskingConfig(max_predictions=5),
      process_index=0, process_count=1, prefetch=2)


def test_prepare_and_load_on_gcs_equal_local(
    gcs_bucket, corpus_files, tiny_spm, tiny_tokenizer, tmp_path, monkeypatch,
    capsys):
  monkeypatch.chdir(tmp_path)  # where a gs:// path taken as local would land
  local, remote = str(tmp_path / "local"), f"{gcs_bucket}/run"
  for root in (local, remote):
    _put(f"{root}/corpus", corpus_files)
  with open(tiny_spm, "rb") as f:
    storage.write_atomic(f"{remote}/spiece.model", f.read())
  _prepare_cli(f"{local}/corpus/part-*", tiny_spm, f"{local}/data")
  # Two spawned workers, which write their shards to gs:// themselves.
  _prepare_cli(f"{remote}/corpus/part-*", f"{remote}/spiece.model",
               f"{remote}/data", num_workers=2)
  assert capsys.readouterr().out.endswith(f"wrote {remote}/data/dataset.json\n")

  want = loader_lib.read_metadata(f"{local}/data")
  got = loader_lib.read_metadata(f"{remote}/data")
  assert got["tokenizer"] == f"{remote}/spiece.model"
  assert got["splits"] == want["splits"]
  assert len(want["splits"]["train"]["files"]) > 2
  assert want["splits"]["eval"]["files"]
  names = sorted(os.fspath(p.relative_to(storage.path(f"{remote}/data")))
                 for pattern in ("*", "units/*")
                 for p in storage.path(f"{remote}/data").glob(pattern)
                 if p.is_file())
  assert names == sorted(
      os.path.relpath(os.path.join(d, f), f"{local}/data")
      for d, _, files in os.walk(f"{local}/data") for f in files)
  assert "units/unit-00000.json" in names
  for name in names:  # these two differ: they name their paths
    if name not in ("dataset.json", prepare.RUN_RECORD):
      assert (storage.path(f"{remote}/data/{name}").read_bytes()
              == storage.path(f"{local}/data/{name}").read_bytes()), name

  for split in ("train", "eval"):
    a = _loader(f"{local}/data", tiny_tokenizer, split)
    b = _loader(f"{remote}/data", tiny_tokenizer, split)
    assert b.files[0].startswith(f"{remote}/data/")
    assert a.num_records == b.num_records
    # Two epochs' worth of steps, through the prefetching threads.
    steps = -(-2 * a.num_records // 8)
    for (s, x), (t, y) in zip(a.iterate(0, steps), b.iterate(0, steps)):
      assert s == t
      for key in loader_lib.BATCH_KEYS:
        np.testing.assert_array_equal(x[key], y[key], err_msg=key)
  assert sorted(os.listdir(tmp_path)) == ["local"]


def test_missing_data_on_gcs_names_the_gs_path(
    gcs_bucket, corpus_files, tiny_spm, tiny_tokenizer):
  root = f"{gcs_bucket}/run"
  with pytest.raises(FileNotFoundError) as e:
    loader_lib.read_metadata(f"{root}/data")
  assert str(e.value) == (
      f"{root}/data has no dataset.json (missing, or its preparation did not "
      "finish); create it with `python -m albert_jax.data.prepare`.")
  with pytest.raises(FileNotFoundError) as e:
    documents.expand_paths(f"{root}/corpus/*.txt")
  assert str(e.value) == f"No files match '{root}/corpus/*.txt'."

  _put(f"{root}/corpus", corpus_files)
  _prepare_cli(f"{root}/corpus/*", tiny_spm, f"{root}/data")
  storage.path(f"{root}/data/train-00000-00001.arrayrecord").unlink()
  with pytest.raises(FileNotFoundError) as e:
    _loader(f"{root}/data", tiny_tokenizer, "train")
  assert str(e.value) == (
      f"1 shard(s) listed in {root}/data/dataset.json are missing, e.g. "
      f"{root}/data/train-00000-00001.arrayrecord.")


def _run_config(corpus: str) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(defaults.upgrade(dict(
      seed=0, model=dict(vocab_size=300),
      data=dict(corpus=corpus, format="sentences", tokenizer="",
                data_dir="", max_seq_length=SEQ, objective="sop",
                nsp_negatives_in_sop=False, short_seq_prob=0.1,
                dupe_factor=1, eval_fraction=0.1, num_workers=1))))


def test_pipeline_prepares_into_a_gcs_workdir_once(
    gcs_bucket, corpus_files, tiny_tokenizer, tmp_path, monkeypatch):
  _put(f"{gcs_bucket}/corpus", corpus_files)
  config = _run_config(f"{gcs_bucket}/corpus/*")
  workdir = f"{gcs_bucket}/run1"
  out = pipeline.ensure_dataset(config.data, workdir, tiny_tokenizer,
                                seed=config.seed)
  assert out == f"{workdir}/data"
  # The same recipe prepared locally gives the same shards.
  _put(str(tmp_path / "corpus"), corpus_files)
  local_config = _run_config(str(tmp_path / "corpus" / "*"))
  local = pipeline.ensure_dataset(local_config.data, str(tmp_path / "run1"),
                                  tiny_tokenizer, seed=local_config.seed)
  meta = loader_lib.read_metadata(out)
  assert meta["splits"] == loader_lib.read_metadata(local)["splits"]
  for name in meta["splits"]["train"]["files"]:
    assert (storage.path(f"{out}/{name}").read_bytes()
            == storage.path(f"{local}/{name}").read_bytes())

  # A rerun (a resume) reuses the prepared data.
  def no_preparing(*args, **kwargs):
    raise AssertionError("prepared again")
  monkeypatch.setattr(prepare, "prepare", no_preparing)
  assert pipeline.ensure_dataset(config.data, workdir, tiny_tokenizer,
                                 seed=config.seed) == out
  config.data.data_dir = out
  assert pipeline.ensure_dataset(config.data, f"{gcs_bucket}/run2",
                                 tiny_tokenizer, seed=config.seed) == out
  assert loader_lib.Loader(
      out, "train", global_batch_size=4, vocab=loader_lib.Vocabulary
      .from_tokenizer(tiny_tokenizer), process_index=0, process_count=1,
      prefetch=0).num_records == meta["splits"]["train"]["instances"]


class _Refusing(http.server.BaseHTTPRequestHandler):
  """Cloud Storage refusing every request (403)."""

  def do_GET(self):  # pylint: disable=invalid-name
    body = b'{"error": {"code": 403, "message": "denied"}}'
    self.send_response(403)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def log_message(self, *args):
    pass


def test_a_shard_cloud_storage_does_not_serve_is_not_called_damaged(
    gcs_bucket, tiny_sop_dataset, tiny_tokenizer, monkeypatch):
  """The client inside ArrayRecord's reader (google-cloud-cpp) is sent to
  a server on 127.0.0.1 that refuses every request: reading a batch names
  the shard and says to run again, not to prepare the data again (which
  it said, as for a corrupt shard), and so does a new loader, which opens
  every shard to count its records (a raw RuntimeError before). An outage
  ends the same way once the reader's own 15 minutes of retries are spent
  ("Retry policy exhausted", the case below)."""
  _, local = tiny_sop_dataset
  root = f"{gcs_bucket}/data"
  _put(root, {name: open(os.path.join(local, name), "rb").read()
              for name in os.listdir(local)
              if os.path.isfile(os.path.join(local, name))})
  loader = _loader(root, tiny_tokenizer, "train")  # counted on the emulator
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    monkeypatch.setenv("CLOUD_STORAGE_EMULATOR_ENDPOINT",
                       f"http://127.0.0.1:{server.server_address[1]}")
    with pytest.raises(shards.ShardReadError) as e:
      loader.local_batch(0)  # readers are opened at the first read
    message = str(e.value)
    assert re.match(rf"Reading prepared data from {root}/train-\S+ failed: "
                    r"Cloud Storage refused ArrayRecord's reader \(Permanent "
                    r"error, with a last message of .*403", message), message
    assert ("The shard is not known to be damaged. Check the network, the "
            "bucket's permissions and that the shard is there") in message
    assert "Prepare the data again" not in message
    with pytest.raises(shards.ShardReadError) as e:
      _loader(root, tiny_tokenizer, "train")  # opens each shard to count
    assert str(e.value).startswith(f"Reading prepared data from {root}/"
                                   "train-"), str(e.value)
    # A prepare rerun's check of a finished shard: the same error, not a
    # raw RuntimeError (nor a unit prepared again for an outage).
    shard = storage.path(f"{root}/train-00000-00000.arrayrecord")
    with pytest.raises(shards.ShardReadError) as e:
      units._shard_problem(shard, {"bytes": shard.stat().length,  # pylint: disable=protected-access
                                   "instances": 1})
    assert str(e.value).startswith(f"Reading prepared data from {shard} "
                                   "failed: Cloud Storage refused"), str(e.value)
  finally:
    server.shutdown()
    server.server_close()
