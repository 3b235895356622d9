"""Smoke test of experiments/benchmarks/attention.py at tiny sizes on CPU.

It checks that the script runs end to end, skips what the backend lacks with
a note, counts FLOPs by the stated convention and that its pallas path
agrees with xla; the timings themselves mean nothing here.
"""

import importlib.util
import json

import pytest

from locations import EXPERIMENTS

SCRIPT = str(EXPERIMENTS / "benchmarks" / "attention.py")


@pytest.fixture(scope="module")
def bench():
  spec = importlib.util.spec_from_file_location("attention_benchmark", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_flop_convention(bench):
  forward = 4 * 2 * 3 * 128 * 128 * 64
  assert bench.flops("fwd", 2, 3, 128, 64) == forward
  assert bench.flops("fwd+bwd", 2, 3, 128, 64) == 3.5 * forward


def test_runs_with_tiny_flags(bench, tmp_path, capsys):
  out_json = tmp_path / "attention.json"
  assert bench.main(["--seqs", "128", "--tokens", "128", "--heads", "1",
                     "--iters", "1", "--warmup", "0", "--json",
                     str(out_json)]) == 0
  printed = capsys.readouterr().out
  assert "| seq | batch | mode | pallas TFLOP/s | cudnn TFLOP/s |" in printed
  assert "note: cudnn: GPU only, skipped on cpu" in printed
  assert "TPU interpret mode: a correctness smoke" in printed
  results = json.loads(out_json.read_text())["results"]
  assert [(r["seq"], r["batch"], r["mode"]) for r in results] == [
      (128, 1, "fwd"), (128, 1, "fwd+bwd")]
  for r in results:
    assert r["cudnn"] is None
    assert r["pallas"] > 0 and r["xla"] > 0
    seconds = r["pallas_ms"] / 1e3
    assert r["pallas"] == pytest.approx(
        bench.flops(r["mode"], 1, 1, 128, 64) / seconds / 1e12)
  # bfloat16 outputs of magnitude ~1: the kernel agrees with xla to bf16.
  assert results[0]["pallas_max_diff"] < 2e-2
  cell = bench._cell(results[0]["pallas"])  # pylint: disable=protected-access
  assert f"| 128 | 1 | fwd | {cell} | n/a |" in printed
