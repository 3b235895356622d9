"""`--compile_only`: the sharded train step compiled for 8 fake CPU devices.

Everything that needs 8 devices runs in subprocesses started together: the
CLI itself, with a mesh given on the command line (`--config.mesh`, parsed
into the config the step is compiled from), and a worker (this file as a
script) that compiles several variants of configs/tiny.py through
`compile_only.analyse`, the function the CLI reports from, and prints their
per-device bytes as JSON.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

# Also run as a script (a subprocess), where tests/ is not on sys.path.
ROOT = pathlib.Path(__file__).resolve().parents[2]
NUM_DEVICES = 8
TIMEOUT = 300
# configs/tiny.py at a batch and length where activations dominate the
# per-device memory (the state is ~1 MiB, the activations tens of MiB).
ACTIVATIONS = ("--config.batch_size=32", "--config.data.max_seq_length=128")
# A tiny model whose parameters sit almost all in the encoder (hidden 256,
# vocab 64), so that sharding them over `fsdp` shrinks the state ~8x; the
# embedding tables are replicated by the default rules.
WIDE = dict(hidden_size=256, intermediate_size=1024, vocab_size=64)


def _env(num_devices: int = NUM_DEVICES, **extra: str) -> dict[str, str]:
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  env["XLA_FLAGS"] = " ".join(
      flags + [f"--xla_force_host_platform_device_count={num_devices}"])
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
  env.update(extra)
  return env


def _cli(*args: str, **env: str) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, "-m", "albert_jax.main", "--config=configs/tiny.py",
       "--compile_only", f"--num_fake_devices={NUM_DEVICES}", *args],
      cwd=ROOT, env=_env(**env), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
  try:
    out, err = proc.communicate(timeout=TIMEOUT)
  except subprocess.TimeoutExpired:
    proc.kill()
    out, err = proc.communicate()
  return proc.returncode, out, err


def _bytes(stdout: str) -> dict[str, int]:
  match = re.search(r"^bytes per device: (\{.*\})$", stdout, re.M)
  assert match, stdout
  return json.loads(match.group(1))


@pytest.fixture(scope="module")
def runs():
  """Starts every subprocess at once; returns their results."""
  procs = {
      # One CLI run serves both CLI tests: its report, and the mesh from the
      # command line (configs/tiny.py's own is data=-1, i.e. data=8).
      "cli": _cli(*ACTIVATIONS, "--config.mesh=(('data',2),('fsdp',4))",
                  ALBERT_JAX_DEVICE_MEMORY_GIB="16"),
      "worker": subprocess.Popen(
          [sys.executable, __file__], cwd=ROOT, env=_env(),
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
  }
  return {name: _finish(proc) for name, proc in procs.items()}


def test_cli_prints_a_positive_per_device_report(runs):
  rc, out, err = runs["cli"]
  assert rc == 0, err[-3000:]
  assert "for 8 cpu devices, mesh data=2, fsdp=4." in out
  # Both data and fsdp split the batch: 8 data-parallel shards.
  assert "batch: 32 global, 4 per data-parallel shard" in out
  mem = _bytes(out)
  for key in ("state", "params", "optimizer", "arguments", "outputs",
              "temporaries", "total"):
    assert mem[key] > 0, (key, out)
  # Besides parameters and optimizer: the step counter and the RNG key.
  assert 0 < mem["state"] - mem["params"] - mem["optimizer"] <= 64
  assert mem["arguments"] == mem["state"] + mem["batch"]
  # The state is donated: the new one reuses its buffers.
  assert mem["aliased"] >= mem["state"] - 16
  assert mem["total"] == (mem["arguments"] + mem["outputs"] - mem["aliased"]
                          + mem["temporaries"])
  assert "fits 16 GiB/device with 10% headroom (14.4 GiB usable): yes" in out


def test_cli_mesh_override(runs):
  """--config.mesh replaces configs/tiny.py's data=-1 (which would be
  data=8, fsdp=1)."""
  rc, out, err = runs["cli"]
  assert rc == 0, err[-3000:]
  assert "mesh data=2, fsdp=4." in out


@pytest.fixture(scope="module")
def worker(runs):
  rc, out, err = runs["worker"]
  assert rc == 0, err[-3000:]
  return json.loads(out.strip().splitlines()[-1])


def test_remat_full_cuts_temporaries(worker):
  none, full = worker["remat_none"], worker["remat_full"]
  assert full["state"] == none["state"]
  # Without remat the step already keeps one array per attention and FFN
  # (the probabilities, the activation's input), so remat saves less than
  # half here (about 46% at this tiny, attention-heavy shape).
  assert full["temporaries"] < 0.6 * none["temporaries"], (none, full)


def test_accumulation_cuts_temporaries(worker):
  one, four = worker["remat_none"], worker["accumulation_4"]
  assert four["state"] == one["state"]
  assert four["temporaries"] < 0.5 * one["temporaries"], (one, four)


def test_fsdp_shards_the_state(worker):
  data, fsdp = worker["wide_data"], worker["wide_fsdp"]
  assert fsdp["params"] < data["params"]
  # ~8x: all but the replicated embeddings and scalars are split 8 ways.
  assert data["state"] / fsdp["state"] > 0.75 * NUM_DEVICES, (data, fsdp)
  assert data["arguments"] / fsdp["arguments"] > 0.75 * NUM_DEVICES


def test_bf16_compiles_as_16_bit_on_cpu(worker):
  f32, bf16 = worker["remat_none"], worker["bfloat16"]
  assert bf16["bf16_as_float16"] and not f32["bf16_as_float16"]
  assert bf16["params"] == f32["params"]  # parameters stay float32
  assert bf16["temporaries"] < 0.9 * f32["temporaries"], (f32, bf16)


def test_fits_and_budget():
  from albert_jax.tools import compile_report  # pylint: disable=g-import-not-at-top
  gib = compile_report.GIB
  assert compile_report.budget(32) == pytest.approx(28.8 * gib)
  assert compile_report.fits(28 * gib, 32)
  assert not compile_report.fits(29 * gib, 32)
  assert compile_report.fits(31 * gib, 32, headroom=0.0)
  assert compile_report.fits(1, None) is None


def test_a_packed_pretraining_compile_says_its_rows_bound_the_run():
  """Packed pre-training (data.pack=3) compiles batch_size rows, the most a
  run can take (it takes the rows that hold batch_size instances), and the
  report says so. One CPU device, in process."""
  from albert_jax import config_lib  # pylint: disable=g-import-not-at-top
  from albert_jax.tools import compile_only  # pylint: disable=g-import-not-at-top
  from albert_jax.tools import compile_report  # pylint: disable=g-import-not-at-top
  config = config_lib.base_config(config_lib.tiny_model(), batch_size=4,
                                  max_seq_length=32, max_predictions=5)
  config.data.pack = 3
  config.mesh = [("data", 1)]
  result = compile_only.analyse(config)
  assert result["target"] == "masked_lm" and result["examples_per_row"] == 3
  assert ("  batch: 4 global, 4 per data-parallel shard, 1 micro-batch of "
          "4; seq 32; optimizer lamb; packed, up to 3 instances a row: a run "
          "takes the rows that hold batch_size instances (fewer), so this "
          "compile of batch_size rows is an upper bound\n"
          ) in compile_report.format_report(
              compile_report.StepShape.from_config(config), result)


def test_parse_mesh():
  from albert_jax.tools import compile_only  # pylint: disable=g-import-not-at-top
  pairs = (("data", 16), ("fsdp", -1))
  assert compile_only.parse_mesh("data:16,fsdp:-1") == pairs
  assert compile_only.parse_mesh("data=16, fsdp=-1") == pairs
  assert compile_only.parse_mesh([["data", 16], ("fsdp", "-1")]) == pairs
  with pytest.raises(ValueError, match="needs a size"):
    compile_only.parse_mesh("data")


def _worker() -> None:
  """Compiles tiny variants on 8 devices; prints {name: bytes} as JSON."""
  sys.path.insert(0, str(ROOT))
  import jax  # pylint: disable=g-import-not-at-top

  from albert_jax import config_lib  # pylint: disable=g-import-not-at-top
  from albert_jax.tools import compile_only  # pylint: disable=g-import-not-at-top
  assert len(jax.devices()) == NUM_DEVICES, jax.devices()

  def config(batch=32, seq=128, accumulation=1, mesh=None, **model):
    c = config_lib.base_config(config_lib.tiny_model(**model),
                               batch_size=batch, max_seq_length=seq)
    c.accumulation_steps = accumulation
    if mesh is not None:
      c.mesh = mesh
    return c

  cases = {
      "remat_none": config(),
      "remat_full": config(remat="full"),
      "accumulation_4": config(accumulation=4),
      "bfloat16": config(dtype="bfloat16"),
      "wide_data": config(batch=8, seq=16, **WIDE),
      "wide_fsdp": config(batch=8, seq=16, mesh=[("data", 1), ("fsdp", -1)],
                          **WIDE),
  }
  results = {}
  for name, c in cases.items():
    r = compile_only.analyse(c)
    results[name] = {k: v for k, v in r.items()
                     if isinstance(v, (int, float, bool))}
  print(json.dumps(results))


if __name__ == "__main__":
  _worker()
