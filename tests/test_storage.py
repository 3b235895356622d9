"""User paths, local and gs:// (on the Cloud Storage emulator)."""

import os
import subprocess
import sys
import threading
import time

import pytest

from albert_jax import storage


def test_path_expands_home_and_keeps_gs(monkeypatch, tmp_path):
  monkeypatch.setenv("HOME", str(tmp_path))
  assert os.fspath(storage.path("~/run1")) == str(tmp_path / "run1")
  assert os.fspath(storage.path("gs://b/run1")) == "gs://b/run1"
  assert storage.is_remote("gs://b/x") and not storage.is_remote("/tmp/x")


@pytest.mark.parametrize("bad,message", [
    ("", "empty path: give a local path or gs://BUCKET/PATH"),
    ("s3://b/x", "s3://b/x: s3:// paths are not supported; use a local path "
     "or gs://BUCKET/PATH"),
    ("gs://", "gs://: no bucket; use gs://BUCKET/PATH"),
])
def test_path_refuses(bad, message):
  with pytest.raises(ValueError) as e:
    storage.path(bad)
  assert str(e.value) == message


@pytest.fixture(params=["local", "gs"])
def root(request, tmp_path):
  if request.param == "local":
    return str(tmp_path)
  return request.getfixturevalue("gcs_bucket") + "/dir"


def test_write_read_glob(root):
  for name in ["a.txt", "b.txt", "sub/c.txt", "d.json"]:
    p = storage.path(f"{root}/{name}")
    p.parent.mkdir(parents=True, exist_ok=True)
    storage.write_atomic(p, name)
  assert storage.path(f"{root}/sub/c.txt").read_text() == "sub/c.txt"
  names = [os.fspath(p)[len(root) + 1:] for p in storage.glob(f"{root}/*.txt")]
  assert names == ["a.txt", "b.txt"]
  assert [p.name for p in storage.glob(f"{root}/**/c.txt")] == ["c.txt"]
  assert [p.name for p in storage.glob(f"{root}/d.json")] == ["d.json"]
  assert storage.glob(f"{root}/none/*.txt") == []
  # No temporary file is left beside the written one.
  assert sorted(p.name for p in storage.path(root).iterdir()) == [
      "a.txt", "b.txt", "d.json", "sub"]


def test_open_atomic_shows_the_old_file_until_the_new_one_is_whole(root):
  storage.path(root).mkdir(parents=True, exist_ok=True)
  target = storage.path(f"{root}/out.jsonl")
  storage.write_atomic(target, "old\n")
  with storage.open_atomic(target) as f:
    f.write(b"new 1\n")
    assert target.read_text() == "old\n"  # still the old one
    f.write(b"new 2\n")
  assert target.read_text() == "new 1\nnew 2\n"
  with pytest.raises(RuntimeError, match="bad row"):
    with storage.open_atomic(target) as f:
      f.write(b"half")
      raise RuntimeError("bad row")
  assert target.read_text() == "new 1\nnew 2\n"
  assert [p.name for p in storage.path(root).iterdir()] == ["out.jsonl"]


def test_age_is_read_from_the_storage_clock(root):
  storage.path(root).mkdir(parents=True, exist_ok=True)
  target = f"{root}/lease.json"
  storage.write_atomic(target, "{}")
  assert 0 <= storage.age(target) < 5
  if not storage.is_remote(root):
    os.utime(target, (0, 1000))  # written at 1000 s after the epoch
    assert storage.age(target) == pytest.approx(time.time() - 1000, abs=5)
  assert [p.name for p in storage.path(root).iterdir()] == ["lease.json"]
  with pytest.raises(FileNotFoundError):
    storage.age(f"{root}/none.json")


def test_same_file(tmp_path):
  (tmp_path / "a").write_text("x")
  (tmp_path / "l").symlink_to(tmp_path / "a")
  os.link(tmp_path / "a", tmp_path / "h")
  for same in ("a", "./a", "l", "h", "../" + tmp_path.name + "/a"):
    assert storage.same_file(tmp_path / "a", f"{tmp_path}/{same}"), same
  assert storage.same_file(tmp_path / "new", f"{tmp_path}/./new")
  assert not storage.same_file(tmp_path / "a", tmp_path / "b")
  assert storage.same_file("gs://b/x/a", "gs://b/x/a")
  assert not storage.same_file("gs://b/x/a", "gs://b/x/b")


def test_create_if_absent_one_winner(root):
  """Of eight racing creators exactly one wins, and its bytes stay."""
  storage.path(root).mkdir(parents=True, exist_ok=True)
  target = f"{root}/lease.json"
  won = []

  def create(i):
    if storage.create_if_absent(target, str(i).encode()):
      won.append(i)

  threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(won) == 1
  assert storage.path(target).read_text() == str(won[0])
  assert not storage.create_if_absent(target, b"again")


def test_emulator_variable_alone_reaches_every_layer(gcs_bucket, tmp_path):
  """A fresh process with only STORAGE_EMULATOR_HOST set: epath (gcsfs),
  orbax/tensorstore and the lease client all reach the emulator."""
  script = f"""
import jax.numpy as jnp, orbax.checkpoint as ocp
from albert_jax import storage
root = "{gcs_bucket}/run"
storage.write_atomic(root + "/note.txt", "hello")
assert storage.create_if_absent(root + "/lease.json", b"x")
with ocp.CheckpointManager(root + "/checkpoints") as mngr:
  mngr.save(3, args=ocp.args.StandardSave({{"w": jnp.arange(4.0)}}))
  mngr.wait_until_finished()
with ocp.CheckpointManager(root + "/checkpoints") as mngr:
  w = mngr.restore(3, args=ocp.args.StandardRestore({{"w": jnp.zeros(4)}}))["w"]
print(storage.path(root + "/note.txt").read_text(), mngr.all_steps(), w.tolist())
"""
  env = {k: v for k, v in os.environ.items()
         if k not in ("TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING",
                      "CLOUD_STORAGE_EMULATOR_ENDPOINT",
                      "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "EPATH_USE_TF")}
  out = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip().splitlines()[-1] == "hello [3] [0.0, 1.0, 2.0, 3.0]"
  assert not (tmp_path / "gs:").exists()
