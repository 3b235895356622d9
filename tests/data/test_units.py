"""`albert_jax.data.units` through `prepare_sources`: hosts that split the
work write the same dataset as one host, a killed prepare resumes, and a
weighted mixture takes each source's documents as often as its weight says.

The corpus is six small files of self-naming documents ("alpha doc 3 line
1 ..."), each file its own unit (a tiny `unit_mb`), so three hosts get two
units each.
"""

import gzip
import json
import os
import shlex
import signal
import subprocess
import sys
import time

from array_record.python import array_record_module
from locations import REPO
import numpy as np
import pytest

from albert_jax import storage
from albert_jax.data import loader as loader_lib
from albert_jax.data import masking
from albert_jax.data import prepare as prep
from albert_jax.data import shards
from albert_jax.data import units as units_lib

SEQ = 32
FILES = 6
DOCS_PER_FILE = 30


def _write_corpus(directory, name, files, docs_per_file, seed):
  """`files` files NAME-k.txt(.gz) of documents naming themselves."""
  rng = np.random.default_rng(seed)
  directory.mkdir(parents=True, exist_ok=True)
  for k in range(files):
    text = "".join(
        "".join(f"{name} doc {k * docs_per_file + d} line {j} is here.\n"
                for j in range(int(rng.integers(2, 6)))) + "\n"
        for d in range(docs_per_file))
    path = directory / f"{name}-{k}.txt"
    if k % 2:
      with gzip.open(f"{path}.gz", "wt", encoding="utf-8") as f:
        f.write(text)
    else:
      path.write_text(text, encoding="utf-8")
  return f"{directory}/{name}-*"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  return _write_corpus(tmp_path_factory.mktemp("corpus"), "alpha", FILES,
                       DOCS_PER_FILE, 0)


def _config(tokenizer, out, **kw):
  kw = {"max_seq_length": SEQ, "docs_per_block": 7, "eval_fraction": 0.2,
        "seed": 5, "unit_mb": 1e-6, **kw}
  return prep.PrepareConfig(tokenizer=tokenizer, output_dir=str(out), **kw)


def _shard_bytes(out, meta):
  return {name: (out / name).read_bytes()
          for s in meta["splits"].values() for name in s["files"]}


@pytest.fixture(scope="module")
def one_host(corpus, tiny_spm, tmp_path_factory):
  out = tmp_path_factory.mktemp("one_host")
  meta = prep.prepare_sources([units_lib.Source(corpus)],
                              _config(tiny_spm, out), progress=None)
  return out, meta


def _loader(out, tokenizer, split):
  return loader_lib.Loader(
      str(out), split, global_batch_size=4,
      vocab=loader_lib.Vocabulary.from_tokenizer(tokenizer), seed=9,
      masking_config=masking.MaskingConfig(max_predictions=4),
      process_index=0, process_count=1, prefetch=0)


def test_three_hosts_write_what_one_host_writes(one_host, corpus, tiny_spm,
                                                tiny_tokenizer, tmp_path):
  out1, meta1 = one_host
  assert meta1["units"] == FILES and len(os.listdir(out1 / "units")) == FILES
  source = [units_lib.Source(corpus)]
  for host in range(3):
    meta3 = prep.prepare_sources(source, _config(tiny_spm, tmp_path), host, 3,
                                 progress=None)
    # Host h wrote units h and h + 3 only; the last one merged.
    assert sorted(os.listdir(tmp_path / "units")) == sorted(
        f"unit-{u:05d}.json" for u in range(FILES) if u % 3 <= host)
    assert (meta3 is None) == (host < 2)
    assert (tmp_path / "dataset.json").exists() == (host == 2)
  assert meta3["splits"] == meta1["splits"]
  assert meta3["read"] == meta1["read"] and meta3["read"]["files"] == FILES
  assert meta3["mixture"] == meta1["mixture"]
  assert _shard_bytes(tmp_path, meta3) == _shard_bytes(out1, meta1)
  # The loader's shuffled, masked batches are the same, step for step.
  for split in ("train", "eval"):
    a, b = (_loader(d, tiny_tokenizer, split) for d in (out1, tmp_path))
    assert a.num_records == b.num_records > 4
    for step in range(2 * a.num_records // 4):
      x, y = a.batch(step), b.batch(step)
      for key in loader_lib.BATCH_KEYS:
        np.testing.assert_array_equal(x[key], y[key], err_msg=key)


def test_bad_host_flags_are_clear_errors(corpus, tiny_spm, tmp_path, capsys):
  base = [f"--input={corpus}", f"--tokenizer={tiny_spm}",
          f"--output_dir={tmp_path}"]
  assert prep.main(base + ["--process_index=3", "--process_count=3"]) == 2
  assert ("--process_index 3 is not in [0, --process_count 3)"
          in capsys.readouterr().err)
  assert prep.main(base + ["--process_index=1"]) == 2
  assert "--process_index and --process_count together" in (
      capsys.readouterr().err)
  assert prep.main(base + ["--input=x", "--weights=1"]) == 2
  assert "--weights has 1 values for 2 --input" in capsys.readouterr().err
  assert prep.main(base + ["--weights=-1"]) == 2
  assert "positive weight" in capsys.readouterr().err
  assert prep.main(base + ["--format=jsonl:"]) == 2
  assert "Unknown --format 'jsonl:'" in capsys.readouterr().err
  assert not os.listdir(tmp_path)  # nothing recorded before the checks
  assert prep.main(base + ["--overwrite", "--process_index=0",
                           "--process_count=2"]) == 2
  assert "--overwrite cannot be used with several hosts" in (
      capsys.readouterr().err)


def _children(pid):
  """Ids of the live processes whose parent is `pid` (Linux /proc)."""
  found = []
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
          fields = f.read().rsplit(")", 1)[1].split()
      except OSError:
        continue
      if int(fields[1]) == pid and fields[0] != "Z":
        found.append(int(entry))
  return found


def _alive(pid):
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="reads /proc")
def test_sigkill_mid_prepare_then_resume(one_host, corpus, tiny_spm,
                                         tmp_path, caplog):
  out1, meta1 = one_host
  out = tmp_path / "out"
  args = [f"--input={corpus}", f"--tokenizer={tiny_spm}",
          f"--output_dir={out}", f"--max_seq_length={SEQ}",
          "--docs_per_block=7", "--eval_fraction=0.2", "--seed=5",
          "--unit_mb=1e-6"]
  proc = subprocess.Popen(
      [sys.executable, "-m", "albert_jax.data.prepare", *args,
       "--num_workers=2"], stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL)
  second = out / "units" / "unit-00001.json"
  deadline = time.monotonic() + 120
  while not second.exists():
    assert proc.poll() is None and time.monotonic() < deadline
    time.sleep(0.01)
  workers = _children(proc.pid)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not (out / "dataset.json").exists()  # killed mid-run
  assert len(workers) >= 2
  deadline = time.monotonic() + 10
  while any(map(_alive, workers)) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not any(map(_alive, workers)), "workers outlived their parent"
  kept = {p.name: p.stat().st_mtime_ns for p in out.glob("train-00000-*")}
  assert kept
  finished = len(os.listdir(out / "units"))
  assert 2 <= finished < FILES

  # Other parameters are refused, and nothing is touched.
  assert prep.main(args + ["--docs_per_block=8"]) == 2
  # A finished unit's damaged shard is found and its unit redone.
  done = sorted(out.glob(f"*-{finished - 1:05d}-00000.arrayrecord"))[0]
  done.write_bytes(done.read_bytes()[:-5])
  damaged = done.stat().st_size
  caplog.set_level("INFO")
  assert prep.main(args) == 0
  assert f"{finished - 1} of this host's {FILES} units are finished" in (
      caplog.text)
  assert f"{done} has {damaged} bytes, not the {damaged + 5} recorded" in (
      caplog.text)
  assert {p.name: p.stat().st_mtime_ns
          for p in out.glob("train-00000-*")} == kept
  meta = json.loads((out / "dataset.json").read_text(encoding="utf-8"))
  assert meta["splits"] == meta1["splits"]
  assert _shard_bytes(out, meta) == _shard_bytes(out1, meta1)
  leftovers = [p for p in os.listdir(out) if p.endswith(".tmp")]
  assert not leftovers


def _records_per_unit(out, meta):
  """Unit number → records in its shards, read from the shards."""
  counts = {}
  for s in meta["splits"].values():
    for name in s["files"]:
      reader = array_record_module.ArrayRecordReader(str(out / name))
      unit = int(name.split("-")[1])
      counts[unit] = counts.get(unit, 0) + reader.num_records()
      reader.close()
  return counts


def test_weighted_mixture(corpus, tiny_spm, tmp_path):
  beta = _write_corpus(tmp_path / "beta", "beta", 2, 100, 1)
  sources = [units_lib.Source(corpus, weight=2.0),
             units_lib.Source(beta, weight=0.3)]
  config = _config(tiny_spm, tmp_path / "out")
  meta = prep.prepare_sources(sources, config, progress=None)
  mixture = meta["mixture"]
  assert [(m["input"], m["weight"]) for m in mixture] == [(corpus, 2.0),
                                                          (beta, 0.3)]
  assert [m["read_documents"] for m in mixture] == [180, 200]
  # Weight 2: every document twice. Weight 0.3: each document by its hash,
  # about 30% of them.
  taken = sum(shards.copies(((FILES + u) << 40) + i, 0.3, config.seed)
              for u in range(2) for i in range(100))
  assert [m["documents"] for m in mixture] == [360, taken]
  assert abs(taken - 0.3 * 200) < 4 * np.sqrt(200 * 0.3 * 0.7)
  splits = meta["splits"]
  assert splits["train"]["documents"] + splits["eval"]["documents"] == (
      360 + taken)
  # The shards hold what the metadata counts, per source.
  per_unit = _records_per_unit(tmp_path / "out", meta)
  assert sum(per_unit.get(u, 0) for u in range(FILES)) == (
      mixture[0]["instances"])
  assert per_unit[FILES] + per_unit[FILES + 1] == mixture[1]["instances"] > 0
  assert (f"input {beta} (weight 0.3): 200 documents read, {taken} taken"
          in prep.summary(meta))
  # Deterministic: the same weights give the same shards.
  again = prep.prepare_sources(sources, _config(tiny_spm, tmp_path / "again"),
                               progress=None)
  assert again["splits"] == splits
  assert (_shard_bytes(tmp_path / "again", again)
          == _shard_bytes(tmp_path / "out", meta))


def test_copies_expectation():
  counts = [shards.copies(i, 1.7, 3) for i in range(4000)]
  assert set(counts) == {1, 2}
  assert abs(np.mean(counts) - 1.7) < 0.03
  assert [shards.copies(i, 2.0, 3) for i in range(5)] == [2] * 5
  assert counts == [shards.copies(i, 1.7, 3) for i in range(4000)]


def _readme_per_host_command() -> tuple[list[str], list[str]]:
  """The README's per-host prepare line: (tpu_setup.sh argv, prepare's
  flags on each worker)."""
  text = (REPO / "README.md").read_text(encoding="utf-8")
  block = text[text.index("<!-- per-host-prepare"):]
  block = block[block.index("```bash\n") + len("```bash\n"):]
  argv = shlex.split(block[:block.index("```")].replace("\\\n", " "))
  remote = shlex.split(argv[argv.index("--") + 1])
  assert remote[:6] == ["cd", "albert_jax", "&&", ".venv/bin/python", "-m",
                        "albert_jax.data.prepare"]
  return argv, remote[6:]


def test_readme_per_host_command_on_three_hosts_in_cloud_storage(
    gcs_bucket, corpus, tiny_spm, monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  argv, flags = _readme_per_host_command()
  dry = subprocess.run(["bash", str(REPO / "tpu_setup.sh"), "--dry_run",
                        *argv[2:]], capture_output=True, text=True,
                       check=False)
  assert dry.returncode == 0, dry.stderr
  assert "--worker=all" in dry.stdout
  assert shlex.quote(argv[argv.index("--") + 1]) in dry.stdout
  assert "--distributed" in flags
  local = os.path.dirname(corpus)
  for k, path in enumerate(sorted(os.listdir(local))):
    with open(os.path.join(local, path), "rb") as f:
      data = f.read()
    storage.write_atomic(f"{gcs_bucket}/corpus/part-{k}.txt.gz",
                         data if path.endswith(".gz") else gzip.compress(data))
  with open(tiny_spm, "rb") as f:
    storage.write_atomic(f"{gcs_bucket}/spm/spiece.model", f.read())
  # Tiny sizes: one worker per host, each file its own unit.
  flags = [f.replace("gs://BUCKET", gcs_bucket) for f in flags]
  flags[flags.index("--num_workers") + 1] = "1"
  flags += ["--unit_mb=1e-6", "--max_seq_length", str(SEQ)]
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
  monkeypatch.setattr(jax, "process_count", lambda: 3)
  data = storage.path(f"{gcs_bucket}/data")
  for host in range(3):
    monkeypatch.setattr(jax, "process_index", lambda h=host: h)
    assert prep.main(flags) == 0
    # Each worker took its place from the runtime: its units only.
    assert sorted(p.name for p in data.glob("units/unit-*.json")) == sorted(
        f"unit-{u:05d}.json" for u in range(FILES) if u % 3 <= host)
  one = flags[:]
  one[one.index("--output_dir") + 1] = f"{gcs_bucket}/one"
  one.remove("--distributed")
  assert prep.main(one) == 0
  other = storage.path(f"{gcs_bucket}/one")
  meta = json.loads((data / "dataset.json").read_text())
  assert meta["units"] == FILES and meta["read"]["files"] == FILES
  assert meta["splits"] == json.loads(
      (other / "dataset.json").read_text())["splits"]
  for s in meta["splits"].values():
    for name in s["files"]:
      assert (data / name).read_bytes() == (other / name).read_bytes(), name


def test_tfds_units_split_across_hosts(tiny_spm, monkeypatch, tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  monkeypatch.setattr(units_lib, "TFDS_UNIT_EXAMPLES", 15)
  source = [units_lib.Source("wikipedia/20230601.en:text", "tfds")]
  with tfds.testing.mock_data(num_examples=40):
    plan = units_lib.plan(source, 64)
    assert [u.examples for u in plan] == [(0, 15), (15, 30), (30, 40)]
    one = prep.prepare_sources(source, _config(tiny_spm, tmp_path / "one",
                                               objective="none"),
                               progress=None)
    for host in range(2):
      two = prep.prepare_sources(source, _config(
          tiny_spm, tmp_path / "two", objective="none"), host, 2,
                                 progress=None)
  assert one["read"]["documents"] == 40 and one["units"] == 3
  assert two["splits"] == one["splits"]
  assert (_shard_bytes(tmp_path / "two", two)
          == _shard_bytes(tmp_path / "one", one))
