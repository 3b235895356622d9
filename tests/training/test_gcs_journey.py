"""A pod user's journey, all in Cloud Storage (a fake-gcs-server on loopback).

The README's pod commands (the block after `<!-- pod-commands`), run as
written with the bucket swapped for the emulator's and tiny sizes:

  copy a corpus → train a tokenizer → prepare → pre-train (SIGKILLed once
  checkpoint 6 is durable) → rerun, which resumes and ends bitwise where an
  uninterrupted run does → fine-tune from `--config.init=gs://…` on files in
  the bucket → `load_pretrained("gs://…")` and `fill_mask`.

Nothing is written to local disk but logs: no `./gs:` folder appears.
Then two processes joined by `jax.distributed` run `python -m
albert_jax.main` on one gs:// workdir: only process 0 writes the shared
files, and each process writes its own checkpoint shards.
"""

import gzip
import itertools
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from albert_jax import storage
from albert_jax.interop.pretrained import load_pretrained
from albert_jax.training import checkpoints
from locations import CORPUS
from locations import REPO
from training.test_resume import _HOOK  # pylint: disable=g-bad-import-order

# Whole runs: the long tier (tests/conftest.py).
pytestmark = pytest.mark.long

TIMEOUT = 300
STEPS, EVERY, SEQ, VOCAB = 12, 3, 32, 300
# The README's sizes → the test's.
_TINY = {"--vocab_size": str(VOCAB), "--max_seq_length": str(SEQ)}
_TINY_RUN = [
    "--config.model.vocab_size=300", f"--config.model.max_position_embeddings={SEQ}",
    f"--config.data.max_seq_length={SEQ}", "--config.masking.max_predictions=5",
    "--config.batch_size=8", f"--config.num_train_steps={STEPS}",
    "--config.optimizer.warmup_steps=2",
    f"--config.checkpoint_every_steps={EVERY}", "--config.keep_checkpoints=10",
    f"--config.log_every_steps={EVERY}", "--config.eval_batches=0",
    "--config.fast_compile=true"]


def readme_pod_commands() -> list[list[str]]:
  """The README's pod commands, each as argv."""
  text = (REPO / "README.md").read_text(encoding="utf-8")
  block = text[text.index("<!-- pod-commands"):]
  block = block[block.index("```bash\n") + len("```bash\n"):]
  block = block[:block.index("```")]
  return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines()
          if line.strip()]


def _swap(argv: list[str], bucket: str) -> list[str]:
  out = []
  for i, arg in enumerate(argv):
    if i and argv[i - 1] in _TINY:
      arg = _TINY[argv[i - 1]]
    out.append(arg.replace("gs://BUCKET", bucket))
  return out


def _env(**hooks):
  """The subprocesses' environment: the session's compilation cache
  (conftest's JAX_COMPILATION_CACHE_DIR; the pre-training runs here compile
  test_resume's programs: same flags, same config) and XLA's backend
  optimisations off, as there (and --config.fast_compile)."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_backend_optimization_level=0"}
  env.update({f"RESUME_TEST_{k.upper()}": str(v) for k, v in hooks.items()})
  return env


def _run(argv, log, env, cwd):
  with open(log, "w", encoding="utf-8") as f:
    out = subprocess.run(argv, cwd=cwd, env=env, stdout=f,
                         stderr=subprocess.STDOUT, timeout=TIMEOUT,
                         check=False)
  assert out.returncode == 0, log.read_text()[-4000:]
  return log.read_text()


def _cli(args, log, env, cwd, **popen):
  """`python -m albert_jax.main ARGS` through the resume tests' hook."""
  with open(log, "w", encoding="utf-8") as f:
    return subprocess.Popen([sys.executable, "-c", _HOOK, *args], cwd=cwd,
                            env=env, stdout=f, stderr=subprocess.STDOUT,
                            **popen)


def _wait(proc, log):
  try:
    proc.wait(timeout=TIMEOUT)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == 0, log.read_text()[-4000:]
  return log.read_text()


def _state(workdir, step):
  """A checkpoint's whole train state, as numpy arrays by path."""
  tree = ocp.PyTreeCheckpointer().restore(
      f"{workdir}/checkpoints/{step}/state")
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat}


@pytest.fixture(scope="module")
def local_corpus(tmp_path_factory) -> str:
  """The bundled corpus's first 400 lines, as one .txt.gz."""
  d = tmp_path_factory.mktemp("corpus")
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    lines = list(itertools.islice(f, 400))
  path = d / "part-0.txt.gz"
  with gzip.open(path, "wt", encoding="utf-8") as f:
    f.writelines(lines)
  return str(path)


def test_readme_pod_journey_on_cloud_storage(gcs_bucket, local_corpus,
                                             tmp_path):
  commands = readme_pod_commands()
  assert [c[:3] for c in commands] == [
      ["gcloud", "storage", "cp"],
      ["python", "-m", "albert_jax.text.train_tokenizer"],
      ["python", "-m", "albert_jax.data.prepare"],
      ["bash", "tpu_setup.sh", "create"], ["bash", "tpu_setup.sh", "install"],
      ["bash", "tpu_setup.sh", "run"]]
  copy, train, prepare, _, _, launch = (_swap(c, gcs_bucket)
                                        for c in commands)
  work = tmp_path / "cwd"
  work.mkdir()
  env = _env()

  # gcloud storage cp CORPUS gs://B/corpus/: the tiny corpus instead.
  assert copy[-1] == f"{gcs_bucket}/corpus/"
  storage.path(copy[-1] + "part-0.txt.gz").write_bytes(
      storage.path(local_corpus).read_bytes())
  _run([sys.executable, *train[1:], "--num_threads", "1"],
       tmp_path / "train.log", env, work)
  _run([sys.executable, *prepare[1:]], tmp_path / "prepare.log", env, REPO)
  meta = json.loads(storage.path(f"{gcs_bucket}/data/dataset.json").read_text())
  assert meta["vocab_size"] == VOCAB and meta["max_seq_length"] == SEQ

  # tpu_setup.sh run -- ARGS: what the workers would run, shown by --dry_run…
  dry = subprocess.run(["bash", str(REPO / "tpu_setup.sh"), "--dry_run",
                        *launch[2:]], capture_output=True, text=True,
                       check=False)
  assert dry.returncode == 0, dry.stderr
  args = launch[launch.index("--") + 1:]
  assert " ".join(shlex.quote(a) for a in args) in dry.stdout
  workdir = f"{gcs_bucket}/albert_base"
  assert (f"checkpoints: {workdir}/checkpoints, TensorBoard: "
          f"{workdir}/tensorboard") in dry.stderr
  # …run here as one process, with the tiny model in place of base.
  assert args[0] == "--config=configs/albert_base.py"
  tiny = ["--config=configs/tiny.py:dropout=0.1", *args[1:], *_TINY_RUN]

  straight = _cli([*tiny, f"--workdir={gcs_bucket}/straight"],
                  tmp_path / "straight.log", env, REPO)
  _wait(straight, tmp_path / "straight.log")
  killed = _cli(tiny, tmp_path / "killed.log", _env(hang_at=8), REPO)
  deadline = time.time() + TIMEOUT
  # Finished as orbax counts it: in a bucket there is no tmp-dir rename, the
  # step directory exists from the start and a commit marker ends it.
  while 6 not in checkpoints.available_steps(workdir):
    assert killed.poll() is None, (tmp_path / "killed.log").read_text()[-4000:]
    assert time.time() < deadline, "no checkpoint 6"
    time.sleep(0.2)
  while "HOOK: holding at step 8" not in (tmp_path / "killed.log").read_text():
    assert time.time() < deadline, "never reached step 8"
    time.sleep(0.1)
  killed.send_signal(signal.SIGKILL)
  killed.wait()
  resumed = _wait(_cli(tiny, tmp_path / "resumed.log", env, REPO),
                  tmp_path / "resumed.log")
  assert f"Resumed from step 6 in {workdir}." in resumed
  want, got = _state(f"{gcs_bucket}/straight", STEPS), _state(workdir, STEPS)
  assert sorted(want) == sorted(got)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)

  # Fine-tune from the bucket on files in the bucket.
  rows = ["text\tlabel"] + [f"{w} {w} mail\t{int(w == 'spam')}"
                            for w in ["spam", "ham"] * 16]
  for name in ("train", "dev"):
    storage.path(f"{gcs_bucket}/ft/{name}.tsv").write_text("\n".join(rows))
  _wait(_cli(["--config=configs/classify.py:steps=4,batch=8,seq=32",
              f"--config.init={workdir}",
              f"--config.data.tokenizer={gcs_bucket}/spm/spiece.model",
              f"--config.data.train_file={gcs_bucket}/ft/train.tsv",
              f"--config.data.eval_file={gcs_bucket}/ft/dev.tsv",
              "--config.data.text_column=text", "--config.fast_compile=true",
              f"--workdir={gcs_bucket}/classify"],
             tmp_path / "finetune.log", env, REPO), tmp_path / "finetune.log")
  assert storage.path(f"{gcs_bucket}/classify/final_metrics.json").exists()

  pretrained = load_pretrained(workdir)
  assert pretrained.step == STEPS
  loaded = {jax.tree_util.keystr(k): np.asarray(v) for k, v in
            jax.tree_util.tree_flatten_with_path(pretrained.params)[0]}
  for key, value in loaded.items():  # the trained weights, bit for bit
    np.testing.assert_array_equal(value, got["['params']" + key], err_msg=key)
  filled = pretrained.fill_mask("the state of the [MASK] is strong", top_k=3)
  probs = filled["probabilities"]
  assert probs.shape == (1, 3) and np.all(np.diff(probs[0]) <= 0)
  assert len(filled["predictions"][0]) == 3
  assert not (work / "gs:").exists() and not (REPO / "gs:").exists()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# Records every shared-file write (storage.write_atomic / create_if_absent)
# with the writing process's index, then runs the CLI.
_WRITES_HOOK = r"""
import os, sys
from albert_jax import storage
log = os.environ["WRITES_LOG"]
def wrap(fn):
  def wrapped(p, *a, **k):
    import jax
    with open(log, "a") as f:
      f.write(f"{jax.process_index()} {os.fspath(p)}\n")
    return fn(p, *a, **k)
  return wrapped
storage.write_atomic = wrap(storage.write_atomic)
storage.create_if_absent = wrap(storage.create_if_absent)
from albert_jax import main

sys.argv = ["albert_jax.main"] + sys.argv[1:]
main.run()
"""


def test_two_processes_share_one_gcs_workdir(gcs_bucket, tiny_sop_dataset,
                                             tmp_path):
  """`python -m albert_jax.main` in two processes joined by
  `jax.distributed` (2 CPU devices each, one 4-way data-parallel mesh),
  data and workdir in the bucket."""
  tokenizer, local_data = tiny_sop_dataset
  data_dir = f"{gcs_bucket}/data"
  for f in storage.path(local_data).iterdir():
    if f.is_file():  # the shards and dataset.json; units/ is prepare's own
      storage.path(f"{data_dir}/{f.name}").write_bytes(f.read_bytes())
  workdir, port = f"{gcs_bucket}/two", _free_port()
  args = ["--config=configs/tiny.py", f"--workdir={workdir}",
          f"--config.data.tokenizer={tokenizer}",
          f"--config.data.data_dir={data_dir}",
          "--config.model.vocab_size=300",
          f"--config.model.max_position_embeddings={SEQ}",
          f"--config.data.max_seq_length={SEQ}",
          "--config.masking.max_predictions=5", "--config.batch_size=8",
          "--config.num_train_steps=4", "--config.checkpoint_every_steps=2",
          "--config.log_every_steps=2", "--config.eval_batches=0",
          "--config.mesh=(('data',-1),)", "--num_fake_devices=2",
          "--config.fast_compile=true",
          f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2"]
  writes = tmp_path / "writes.txt"
  env = {**_env(), "WRITES_LOG": str(writes)}
  procs = []
  for i in range(2):
    log = tmp_path / f"process{i}.log"
    procs.append((subprocess.Popen(
        [sys.executable, "-c", _WRITES_HOOK, *args, f"--process_id={i}"],
        cwd=REPO, env=env, stdout=open(log, "w", encoding="utf-8"),  # pylint: disable=consider-using-with
        stderr=subprocess.STDOUT), log))
  for proc, log in procs:
    _wait(proc, log)
  by_process = {}
  for line in writes.read_text().splitlines():
    index, path = line.split(" ", 1)
    by_process.setdefault(int(index), []).append(path[len(workdir) + 1:])
  assert sorted(set(by_process[0])) == [
      "config.json", "final_metrics.json", "git_commit.txt", "goodput.json",
      "lease.json", "recipe.json"]
  assert 1 not in by_process, by_process.get(1)
  shards = sorted(p.name for p in
                  storage.path(f"{workdir}/checkpoints/4/state").iterdir()
                  if p.name.startswith("ocdbt.process_"))
  assert shards == ["ocdbt.process_0", "ocdbt.process_1"]
  tb = [p.name for p in storage.path(f"{workdir}/tensorboard").iterdir()]
  assert len([n for n in tb if n.startswith("events.out")]) == 1
