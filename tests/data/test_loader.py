"""`albert_jax.data.loader`: shuffled, masked, per-host, resumable batches.

One small prepared dataset (≈250 records, 64 tokens) and batches of 32, so
an epoch is ≈8 steps and a dozen steps cross an epoch boundary. The
properties under test are the loader's contract: step s's batch is a pure
function of (seed, s); hosts split each global batch; every record once per
epoch; static masks fixed per record, dynamic ones fresh per epoch.
"""

import gzip
import itertools
import json
import os
import shutil

import jax
from locations import CORPUS
import numpy as np
import pytest

from albert_jax import sharding as sharding_lib
from albert_jax.data import instances as inst_lib
from albert_jax.data import loader as loader_lib
from albert_jax.data import shards
from albert_jax.data import masking
from albert_jax.data import prepare as prep
from albert_jax.text import train_tokenizer as text_train

SEQ, BATCH = 64, 32
MCFG = masking.MaskingConfig(max_predictions=8)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  d = tmp_path_factory.mktemp("spm")
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    lines = list(itertools.islice(f, 600))
  (d / "corpus.txt").write_text("".join(lines), encoding="utf-8")
  return text_train.train(str(d / "corpus.txt"), 600, output=d / "spm.model",
                          seed=5, num_threads=2)


@pytest.fixture(scope="module")
def vocab(tok):
  return loader_lib.Vocabulary.from_tokenizer(tok)


@pytest.fixture(scope="module")
def data_dir(tok, tmp_path_factory):
  """≈250 SOP instances in several shards."""
  out = tmp_path_factory.mktemp("data")
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    lines = [l.strip() for l in itertools.islice(f, 600)]
  # Re-cut into documents of 6 sentences so there are many small ones.
  docs = [lines[i:i + 6] for i in range(0, len(lines), 6)]
  docs = [[s for s in d if s] for d in docs]
  config = prep.PrepareConfig(tokenizer=tok.path, output_dir=str(out),
                              max_seq_length=SEQ, docs_per_block=25,
                              eval_fraction=0.1, seed=1)
  meta = prep.prepare(iter(docs), config, progress=None)
  assert len(meta["splits"]["train"]["files"]) > 2
  assert 150 < meta["splits"]["train"]["instances"] < 400
  return str(out)


def _loader(data_dir, vocab, **kw):
  kw = {"global_batch_size": BATCH, "seed": 3, "process_index": 0,
        "process_count": 1, "masking_config": MCFG, **kw}
  return loader_lib.Loader(data_dir, "train", vocab=vocab, **kw)


def _assert_equal(a, b):
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), k)
    assert np.asarray(a[k]).dtype == np.asarray(b[k]).dtype


def _steps(loader, start, n):
  return [b for _, b in loader.iterate(start, n)]


def test_shapes_and_dtypes(data_dir, vocab):
  batch = _loader(data_dir, vocab).batch(0)
  p = MCFG.max_predictions
  expect = {"input_ids": ((BATCH, SEQ), np.int32),
            "token_type_ids": ((BATCH, SEQ), np.int32),
            "attention_mask": ((BATCH, SEQ), np.int32),
            "masked_positions": ((BATCH, p), np.int32),
            "masked_ids": ((BATCH, p), np.int32),
            "masked_weights": ((BATCH, p), np.float32),
            "sentence_labels": ((BATCH,), np.int32)}
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == expect
  assert set(np.unique(batch["sentence_labels"])) <= {0, 1}


def test_masking_invariants(data_dir, vocab, tok):
  loader = _loader(data_dir, vocab)
  raw = loader._source
  masked_tokens = replaced_by_mask = 0
  for step in range(4):
    batch = loader.batch(step)
    records, _ = loader.record_indices(step)
    for row, index in enumerate(records):
      inst = inst_lib.from_bytes(raw[int(index)])
      n = len(inst.tokens)
      ids = batch["input_ids"][row]
      w = batch["masked_weights"][row] > 0
      pos = batch["masked_positions"][row][w]
      assert batch["attention_mask"][row].sum() == n
      # One instance, then padding: what the pre-training objectives
      # promise attention (right_padded=True, which takes row lengths).
      np.testing.assert_array_equal(batch["attention_mask"][row],
                                    (np.arange(len(ids)) < n).astype(int))
      np.testing.assert_array_equal(batch["token_type_ids"][row, :n],
                                    inst.token_type_ids)
      assert (ids[n:] == tok.pad_id).all()
      # Predictions: sorted, inside the text, never a special token, with
      # the original ids as labels; weights are a prefix.
      assert np.all(np.diff(pos) > 0) and np.all(pos < n)
      assert not np.isin(inst.tokens[pos], [tok.cls_id, tok.sep_id]).any()
      np.testing.assert_array_equal(batch["masked_ids"][row][w],
                                    inst.tokens[pos])
      assert w.tolist() == sorted(w.tolist(), reverse=True)
      budget = min(MCFG.max_predictions, max(1, round(n * 0.15)))
      assert 0 < w.sum() <= budget
      # Only predicted positions may differ from the record.
      changed = np.flatnonzero(ids[:n] != inst.tokens)
      assert set(changed) <= set(pos)
      masked_tokens += len(pos)
      replaced_by_mask += int((ids[pos] == tok.mask_id).sum())
  assert 0.65 < replaced_by_mask / masked_tokens < 0.95  # ≈80% [MASK]


def test_same_seed_same_batches(data_dir, vocab):
  a = _steps(_loader(data_dir, vocab), 0, 3)
  b = _steps(_loader(data_dir, vocab, prefetch=0), 0, 3)
  for x, y in zip(a, b):
    _assert_equal(x, y)
  c = _loader(data_dir, vocab, seed=4).batch(0)
  assert not np.array_equal(a[0]["input_ids"], c["input_ids"])


def test_exact_resume_across_epoch_boundary(data_dir, vocab):
  loader = _loader(data_dir, vocab, prefetch=3)
  assert 4 < loader.steps_per_epoch < 12
  run = _steps(loader, 0, 14)
  for k in (1, 7, int(loader.steps_per_epoch), 12):
    resumed = _steps(_loader(data_dir, vocab), k, 14 - k)
    assert len(resumed) == 14 - k
    for x, y in zip(run[k:], resumed):
      _assert_equal(x, y)
  assert [s for s, _ in loader.iterate(5, 3)] == [5, 6, 7]


def test_hosts_split_the_global_batch(data_dir, vocab):
  whole = _loader(data_dir, vocab)
  hosts = [_loader(data_dir, vocab, process_index=i, process_count=2)
           for i in range(2)]
  assert hosts[0].local_batch_size == BATCH // 2
  for step in (0, 5, 9):
    parts = [h.local_batch(step) for h in hosts]
    joined = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    _assert_equal(joined, whole.local_batch(step))
    r0, r1 = (h.record_indices(step)[0] for h in hosts)
    assert not set(r0) & set(r1)


def _per_record(loader, num_steps):
  """{(record, epoch): masked input_ids row} over the first steps."""
  out = {}
  for step in range(num_steps):
    batch = loader.batch(step)
    for row, (r, e) in enumerate(zip(*loader.record_indices(step))):
      out[int(r), int(e)] = batch["input_ids"][row]
  return out


def test_every_record_once_per_epoch(data_dir, vocab):
  loader = _loader(data_dir, vocab)
  n = loader.num_records
  steps = -(-2 * n // BATCH) + 1
  seen = [loader.record_indices(s) for s in range(steps)]
  records = np.concatenate([r for r, _ in seen])
  epochs = np.concatenate([e for _, e in seen])
  assert list(epochs[:2 * n]) == [0] * n + [1] * n
  for e in (0, 1):
    assert sorted(records[epochs == e][:n]) == list(range(n))
  assert not np.array_equal(records[:n], records[n:2 * n])  # reshuffled


@pytest.mark.parametrize("dynamic", [False, True])
def test_static_and_dynamic_masking(data_dir, vocab, dynamic):
  loader = _loader(data_dir, vocab, dynamic_masking=dynamic)
  rows = _per_record(loader, -(-2 * loader.num_records // BATCH))
  both = [r for r in range(loader.num_records)
          if (r, 0) in rows and (r, 1) in rows]
  assert len(both) == loader.num_records
  same = sum(np.array_equal(rows[r, 0], rows[r, 1]) for r in both)
  if dynamic:
    assert same < 0.1 * len(both)
  else:
    assert same == len(both)


def test_global_arrays_on_mesh(data_dir, vocab):
  mesh = jax.make_mesh((1,), ("data",))
  sharding = sharding_lib.data_sharding(mesh)
  assert sharding.spec == jax.sharding.PartitionSpec(("data",))
  loader = _loader(data_dir, vocab, sharding=sharding)
  local = loader.local_batch(2)
  for batch in (loader.batch(2), next(loader.iterate(2))[1]):
    for k, v in batch.items():
      assert isinstance(v, jax.Array) and v.sharding == sharding
      assert v.shape == local[k].shape
      np.testing.assert_array_equal(np.asarray(v), local[k])


def test_eval_split(data_dir, vocab):
  loader = loader_lib.Loader(data_dir, "eval", global_batch_size=4,
                             vocab=vocab, process_index=0, process_count=1)
  assert loader.num_records == loader.metadata["splits"]["eval"]["instances"]
  assert loader.batch(0)["input_ids"].shape == (4, SEQ)


def test_clear_errors(data_dir, vocab, tmp_path):
  small = loader_lib.Vocabulary(
      word_start=np.ones(100, bool), special=np.zeros(100, bool), mask_id=4,
      pad_id=0)
  with pytest.raises(ValueError, match="vocabulary of 600 pieces.*has 100"):
    _loader(data_dir, small)
  with pytest.raises(FileNotFoundError, match="no dataset.json.*prepare"):
    _loader(str(tmp_path), vocab)
  with pytest.raises(ValueError, match="not divisible by the 3 processes"):
    _loader(data_dir, vocab, global_batch_size=32, process_count=3)
  with pytest.raises(FileNotFoundError, match="no 'test' shards"):
    loader_lib.Loader(data_dir, "test", global_batch_size=4, vocab=vocab,
                      process_index=0, process_count=1)


def test_only_listed_shards_are_read(data_dir, vocab, tmp_path):
  copy = tmp_path / "copy"
  shutil.copytree(data_dir, copy)
  meta = json.loads((copy / "dataset.json").read_text())
  first = meta["splits"]["train"]["files"][0]
  # A stray shard from another run is ignored...
  shutil.copy(copy / first, copy / "train-99999.arrayrecord")
  _assert_equal(_loader(str(copy), vocab).batch(0),
                _loader(data_dir, vocab).batch(0))
  # ...and a missing one is an error, not a silently smaller dataset.
  os.remove(copy / first)
  with pytest.raises(FileNotFoundError, match="missing"):
    _loader(str(copy), vocab)


def test_trainer_passes_every_masking_field():
  """Each MaskingConfig field is a config.masking key the trainer honours:
  set to a non-default value, it reaches the loader's MaskingConfig."""
  import dataclasses  # pylint: disable=g-import-not-at-top

  from albert_jax import config_lib  # pylint: disable=g-import-not-at-top
  from albert_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  config = config_lib.base_config(config_lib.tiny_model())
  changed = dict(max_predictions=7, masked_lm_prob=0.2, max_ngram=2,
                 favor_shorter_ngram=False, whole_word=False,
                 mask_token_prob=0.85, random_token_prob=0.0)
  fields = {f.name for f in dataclasses.fields(masking.MaskingConfig)}
  assert set(changed) == fields
  assert fields <= set(config.masking)
  config.masking.update(changed)
  got = pipeline.masking_config(config.masking)
  assert dataclasses.asdict(got) == changed


def test_unmasked_batches(data_dir, vocab):
  """masking_config=None: the instances' tokens as they are, no targets."""
  masked = loader_lib.Loader(data_dir, global_batch_size=4, vocab=vocab,
                             seed=3, prefetch=0)
  plain = loader_lib.Loader(data_dir, global_batch_size=4, vocab=vocab,
                            seed=3, prefetch=0, masking_config=None)
  a, b = masked.local_batch(2), plain.local_batch(2)
  for key in ("token_type_ids", "attention_mask", "sentence_labels"):
    np.testing.assert_array_equal(a[key], b[key])
  # Unmasking the masked batch's targets gives back the plain tokens.
  restored = a["input_ids"].copy()
  rows = np.arange(4)[:, None]
  w = a["masked_weights"] > 0
  restored[np.broadcast_to(rows, w.shape)[w], a["masked_positions"][w]] = (
      a["masked_ids"][w])
  np.testing.assert_array_equal(restored, b["input_ids"])
  assert b["masked_positions"].shape == (4, 0)
  assert b["masked_weights"].dtype == np.float32


@pytest.mark.parametrize("damage", ["garbage", "id past the vocabulary"])
def test_a_record_that_reads_but_is_no_instance_names_the_shard(
    data_dir, vocab, tmp_path, damage):
  """Records the shard format reads back whole but whose content is wrong:
  garbage bytes, or an instance of ids the vocabulary does not have (data
  prepared with another tokenizer). Was a bare "Instance record of 41 bytes
  …" or an IndexError deep in masking."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  copy = tmp_path / "data"
  shutil.copytree(data_dir, copy)
  shard = sorted(copy.glob("train-*.arrayrecord"))[0]
  reader = array_record_module.ArrayRecordReader(str(shard))
  records = reader.read_all()
  reader.close()
  if damage == "garbage":
    records = [b"\x07" * 41 for _ in records]
    what = ("is not an instance (Instance record of 41 bytes does not match "
            "its declared length")
  else:
    bad = inst_lib.from_bytes(records[0])
    tokens = bad.tokens.copy()
    tokens[1] = vocab.size + 7
    records = [inst_lib.to_bytes(inst_lib.Instance(
        tokens, bad.token_type_ids, bad.label)) for _ in records]
    what = (f"holds token id {vocab.size + 7}, outside the vocabulary's "
            f"{vocab.size} ids (the data was prepared with another tokenizer, "
            "or is damaged)")
  shard.unlink()
  writer = array_record_module.ArrayRecordWriter(str(shard), "group_size:1")
  for record in records:
    writer.write(record)
  writer.close()
  loader = _loader(str(copy), vocab, prefetch=0)
  with pytest.raises(loader_lib.DamagedShardError) as e:
    for step in range(50):
      loader.local_batch(step)
  message = str(e.value)
  assert message.startswith(f"Prepared data is damaged: {shard} (record ")
  assert what in message
  assert message.endswith(
      ". Prepare the data again (python -m albert_jax.data.prepare) into a "
      "new --output_dir, or restore the file from a copy.")


def test_a_damaged_shard_names_the_file_and_the_fix(data_dir, vocab, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  copy = tmp_path / "data"
  shutil.copytree(data_dir, copy)
  shard = sorted(copy.glob("train-*.arrayrecord"))[0]
  blob = bytearray(shard.read_bytes())
  for i in range(200, 1200):  # scramble the first records' chunks
    blob[i] ^= 0x5A
  shard.write_bytes(bytes(blob))
  loader = _loader(str(copy), vocab, prefetch=0)
  with pytest.raises(loader_lib.DamagedShardError) as e:
    for step in range(50):  # every record is read within a few epochs' steps
      loader.batch(step)
  message = str(e.value)
  assert message.startswith(f"Prepared data is damaged: {shard} (record ")
  assert message.endswith(
      "Prepare the data again (python -m albert_jax.data.prepare) into a new "
      "--output_dir, or restore the file from a copy.")
  assert "\n" not in message


# What ArrayRecord's reader (array_record 0.8.6) raised for a gs:// shard
# once the client inside it gave up on a refused port: after 901.6 s of
# its own retries, which the suite cannot wait for.
_GAVE_UP = ("Retry policy exhausted, with a last message of PerformWork() - "
            "CURL error [7]=Couldn't connect to server; reading "
            "gs://b/d/train-00000-00001.arrayrecord; at byte 0")


def test_a_shard_read_cloud_storage_gave_up_on_is_an_outage():
  """Named as Cloud Storage's failure with the shard and "run again", not
  as damage ("prepare the data again"); the same text for local files,
  and a corrupt shard's error, are left to the damage check."""
  files = [f"gs://b/d/train-00000-0000{i}.arrayrecord" for i in range(2)]
  message = shards.unserved(files, RuntimeError(_GAVE_UP))
  assert message.startswith(
      f"Reading prepared data from {files[1]} failed: Cloud Storage did not "
      "answer ArrayRecord's reader, which gave up after its own retries "
      f"({_GAVE_UP}). The shard is not known to be damaged."), message
  assert f"(gcloud storage ls {files[1]}), then run again" in message
  assert "Prepare the data again" not in message
  local = [f.replace("gs://b", "/data") for f in files]
  assert shards.unserved(local, RuntimeError(_GAVE_UP)) is None
  assert shards.unserved(
      files, RuntimeError("chunk header hash mismatch")) is None


@pytest.fixture(scope="module")
def packed_dir(tok, tmp_path_factory):
  """Short documents (three sentences of at most five words), so most
  instances fill half a row or less, prepared packed (K = 3) and unpacked:
  (packed, unpacked) dirs."""
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    lines = [" ".join(l.split()[:5]) for l in itertools.islice(f, 600)]
  docs = [[s for s in lines[i:i + 3] if s] for i in range(0, len(lines), 3)]
  out = []
  for pack in (3, 0):
    d = tmp_path_factory.mktemp(f"pack{pack}")
    prep.prepare(iter(docs), prep.PrepareConfig(
        tokenizer=tok.path, output_dir=str(d), max_seq_length=SEQ,
        docs_per_block=25, short_seq_prob=0.5, seed=1, pack=pack),
                 progress=None)
    out.append(str(d))
  return tuple(out)


def test_packed_rows_keep_each_instance_whole(packed_dir, vocab, tok):
  packed, unpacked = (_loader(d, vocab) for d in packed_dir)
  meta = packed.metadata["splits"]["train"]
  assert meta["instances"] == unpacked.num_records > meta["rows"] == (
      packed.num_records)
  p = masking.packed_predictions(MCFG, SEQ, 3)
  assert packed.num_predictions == p == min(3 * 8, int(SEQ * 0.15) + 3)
  schema = loader_lib.batch_schema(BATCH, SEQ, p, 3)
  real = 0
  for step in range(3):
    batch = packed.batch(step)
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == schema
    records, _ = packed.record_indices(step)
    for row, index in enumerate(records):
      row_instances = inst_lib.from_bytes_packed(
          packed._source[int(index)])
      w = batch["masked_weights"][row] > 0
      pos = batch["masked_positions"][row][w]
      assert np.all(np.diff(pos) > 0)
      at = 0
      for slot, inst in enumerate(row_instances):
        n = len(inst.tokens)
        span = slice(at, at + n)
        assert batch["cls_positions"][row, slot] == at
        assert batch["sentence_labels"][row, slot] == inst.label
        assert (batch["attention_mask"][row, span] == slot + 1).all()
        np.testing.assert_array_equal(batch["token_type_ids"][row, span],
                                      inst.token_type_ids)
        # The instance's own budget, scaled by its own length.
        mine = pos[(pos >= at) & (pos < at + n)]
        assert len(mine) == min(MCFG.max_predictions,
                                max(1, round(n * 0.15)))
        ids = batch["input_ids"][row, span]
        assert set(np.flatnonzero(ids != inst.tokens)) <= set(mine - at)
        np.testing.assert_array_equal(
            batch["masked_ids"][row][w][(pos >= at) & (pos < at + n)],
            inst.tokens[mine - at])
        at += n
      k = len(row_instances)
      assert (batch["attention_mask"][row, at:] == 0).all()
      assert (batch["input_ids"][row, at:] == tok.pad_id).all()
      assert (batch["sentence_labels"][row, k:] == -1).all()
      assert w.sum() == len(pos) and w.tolist() == sorted(w.tolist(),
                                                          reverse=True)
      real += at
  # Packing fills the rows: far less padding than one instance per row.
  unpacked_real = sum(int((unpacked.batch(s)["attention_mask"] > 0).sum())
                      for s in range(3))
  assert 1 - real / (3 * BATCH * SEQ) < 0.5 * (
      1 - unpacked_real / (3 * BATCH * SEQ))


def test_packed_batches_resume_exactly(packed_dir, vocab):
  loader = _loader(packed_dir[0], vocab, prefetch=2)
  run = _steps(loader, 0, 8)
  for k in (1, int(loader.steps_per_epoch) + 1):
    for x, y in zip(run[k:], _steps(_loader(packed_dir[0], vocab), k,
                                    8 - k)):
      _assert_equal(x, y)


def test_step_positions_are_the_steps_slice_of_the_endless_stream():
  """Step s takes positions s·B … s·B+B−1; a host its rows of them; the
  rule every step-indexed batch source (this loader, fine-tuning's
  batches) reads its steps by."""
  np.testing.assert_array_equal(loader_lib.step_positions(0, 4), [0, 1, 2, 3])
  np.testing.assert_array_equal(loader_lib.step_positions(3, 4),
                                [12, 13, 14, 15])
  np.testing.assert_array_equal(
      loader_lib.step_positions(3, 8, slice(4, 8)), [28, 29, 30, 31])
  assert loader_lib.step_positions(2, 4).dtype == np.int64
  with pytest.raises(ValueError, match="step must be >= 0, got -1"):
    loader_lib.step_positions(-1, 4)
