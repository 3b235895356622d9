"""albert_jax.tools.report and the metrics.jsonl reader it uses: the reader,
the run table and the curves.

Runs are faked: a real config's config.json, a final_metrics.json and the
metrics.jsonl and TensorBoard events written by the trainer's own
`metrics.Writer`. The expected parameter counts and FLOPs are worked out here
from the model's dimensions, independently of albert_jax.tools.summary and
albert_jax.model.flops.
"""

import glob
import json
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import tempfile

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from locations import CONFIGS
from matplotlib import image as mpimg
import pytest

from albert_jax.tools import report
from albert_jax.tools import sweep
from albert_jax.training import metrics

from plugin_noise import without_plugin_noise  # pylint: disable=g-bad-import-order

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# The metrics.jsonl reader against the Writer.


def test_reader_round_trips_the_writer(tmp_path):
  w = metrics.Writer(str(tmp_path))
  w.write(3, {"train/loss": 1.5, "eval/mlm_accuracy": 0.25})
  w.write(7, {"train/loss": 1.25, "train/mfu": None, "bad": float("nan")})
  w.close()
  assert report.read_scalars(str(tmp_path)) == {
      "train/loss": [(3, 1.5), (7, 1.25)], "eval/mlm_accuracy": [(3, 0.25)]}
  # A resumed run logs step 7 again, from a new Writer: the later value wins.
  w = metrics.Writer(str(tmp_path))
  w.write(7, {"train/loss": 0.75})
  w.write(9, {"train/loss": 0.5})
  w.close()
  assert report.read_scalars(str(tmp_path)) == {
      "train/loss": [(3, 1.5), (7, 0.75), (9, 0.5)],
      "eval/mlm_accuracy": [(3, 0.25)]}


# "step" is the line's own key.
tags = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)),
               min_size=1, max_size=20).filter(lambda tag: tag != "step")
values = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**62), st.dictionaries(
    tags, values, max_size=4)), max_size=6))
def test_metrics_jsonl_round_trips_any_scalars(writes):
  with tempfile.TemporaryDirectory() as logdir:
    w = metrics.Writer(logdir)
    for step, scalars in writes:
      w.write(step, scalars)
    w.close()
    with open(os.path.join(logdir, metrics.METRICS_FILE),
              encoding="utf-8") as f:
      rows = [json.loads(line) for line in f]
  assert [(row.pop("step"), row) for row in rows] == writes


def test_a_cut_off_last_line_ends_the_file_and_a_bad_line_fails(tmp_path):
  w = metrics.Writer(str(tmp_path))
  w.write(1, {"a": 1.0})
  w.write(2, {"a": 2.0})
  w.close()
  path = tmp_path / metrics.METRICS_FILE
  data = path.read_text()
  first, second = data.splitlines()
  path.write_text(data[:-3])  # killed while writing step 2
  assert report.read_scalars(str(tmp_path)) == {"a": [(1, 1.0)]}
  # Resumed after that: the cut-off line is not the last one any more.
  path.write_text(data[:-3] + data)
  bad = second[:-2] + first
  with pytest.raises(report.ReportError, match="^" + re.escape(
      f"{path}: line 2 is not a logged step: {bad!r}") + "$"):
    report.read_scalars(str(tmp_path))
  path.write_text('{"a": 1.0}\n' + data)
  with pytest.raises(report.ReportError, match="line 1 is not a logged step"):
    report.read_scalars(str(tmp_path))


# Fake runs.


def _load_config(spec):
  _, module, arg = sweep._load(spec)  # pylint: disable=protected-access
  return module.get_config(arg)


def _tiny_config(share, objective, steps):
  c = _load_config(f"{CONFIGS}/tiny.py:share={share}")
  c.data.objective = objective
  c.num_train_steps = steps
  return c


def _make_run(root, name, config, final, scalars):
  run = root / name
  run.mkdir(parents=True)
  (run / "config.json").write_text(config.to_json_best_effort(indent=2))
  (run / "final_metrics.json").write_text(json.dumps(final))
  w = metrics.Writer(str(run / "tensorboard"))
  for step, values in scalars:
    w.write(step, values)
  w.close()
  return str(run)


@pytest.fixture(name="runs")
def fixture_runs(tmp_path):
  """Two ALBERT-tiny runs (all shared, none shared) and one without SOP."""
  root = tmp_path / "sweep"
  a = _make_run(
      root, "share=all", _tiny_config("all", "sop", 30),
      {"step": 30, "skipped_steps": 0, "eval_mlm_accuracy": 0.125,
       "eval_mlm_loss": 5.5, "eval_sop_accuracy": 0.625,
       "eval_unigram_baseline_accuracy": 0.0625},
      [(10, {"train/loss": 7.0}), (15, {"eval/mlm_accuracy": 0.0625}),
       (20, {"train/loss": 6.5}),
       (30, {"train/loss": 6.0, "eval/mlm_accuracy": 0.125,
             "eval/unigram_baseline_accuracy": 0.0625})])
  b = _make_run(
      root, "share=none", _tiny_config("none", "sop", 30),
      {"step": 30, "skipped_steps": 0, "eval_mlm_accuracy": 0.1875,
       "eval_mlm_loss": 5.25, "eval_sop_accuracy": 0.5,
       "eval_unigram_baseline_accuracy": 0.0625},
      [(10, {"train/loss": 6.75}), (30, {"train/loss": 5.75,
                                         "eval/mlm_accuracy": 0.1875})])
  c = _make_run(
      root, "objective=none", _tiny_config("all", "none", 20),
      {"step": 20, "skipped_steps": 0, "eval_mlm_accuracy": 0.09375,
       "eval_mlm_loss": 6.125, "finetune": {"step": 5}},
      [(10, {"train/loss": 7.25}), (20, {"train/loss": 6.25,
                                         "eval/mlm_loss": 6.125})])
  return [a, b, c]


# ALBERT-tiny: vocab 1000, E=32, H=64, 2 layers, FFN 128, 128 positions;
# configs/tiny.py: batch 8, 128 tokens, 20 predictions.
V, E, H, L, F, POS, T, P, B = 1000, 32, 64, 2, 128, 128, 128, 20, 8


def _params(copies):
  embeddings = V * E + POS * E + 2 * E + 2 * E  # word, position, type, LN
  projection = E * H + H
  attention = 4 * (H * H + H) + 2 * H  # Q, K, V, output; LayerNorm
  ffn = H * F + F + F * H + H + 2 * H
  pooler = H * H + H
  return embeddings + projection + copies * (attention + ffn) + pooler


def _flops(steps, sop):
  forward = (2 * T * E * H + L * T * 8 * H * H + L * 4 * T * T * H
             + L * 4 * T * H * F + 2 * H * H + (2 * H * 2 if sop else 0)
             + P * 2 * H * E + P * 2 * E * V)
  return 3 * B * forward * steps


def test_report_table_and_curves(runs, tmp_path, capsys):
  out = tmp_path / "out"
  assert report.main([*runs, f"--out={out}"]) == 0
  table = (out / "report.md").read_text()
  expected = [
      "| run | model.share | data.objective | num_train_steps | step "
      "| eval_mlm_accuracy | eval_mlm_loss | eval_sop_accuracy "
      "| eval_unigram_baseline_accuracy | params | train FLOPs |",
      "|---|---|---|---|---|---|---|---|---|---|---|",
      f"| share=all | all | sop | 30 | 30 | 0.125 | 5.5 | 0.625 | 0.0625 "
      f"| {_params(1):,} | {_flops(30, True):.3e} |",
      f"| share=none | none | sop | 30 | 30 | 0.1875 | 5.25 | 0.5 | 0.0625 "
      f"| {_params(L):,} | {_flops(30, True):.3e} |",
      f"| objective=none | all | none | 20 | 20 | 0.09375 | 6.125 |  |  "
      f"| {_params(1):,} | {_flops(20, False):.3e} |"]
  assert table.splitlines()[2:7] == expected
  assert table.startswith("# Pre-training runs\n\n")
  assert table.endswith("\n\n![training curves](curves.png)\n")
  # The sums, written out: 36,224 + 2,112 + 16,768 + 16,704 + 4,160 and
  # 524,288 + 8,388,608 + 8,388,608 + 8,388,608 + 8,192 + 256 + 81,920
  # + 1,280,000 per sequence of 128.
  assert _params(1) == 75_968
  assert _flops(30, True) == 3 * 8 * 30 * 27_060_480
  printed = capsys.readouterr().out
  assert printed.splitlines()[:5] == expected[:1] + [expected[1]] + expected[
      2:5]
  assert f"Wrote {out}/report.md and {out}/curves.png." in printed

  png = (out / "curves.png").read_bytes()
  assert png[:8] == PNG_SIGNATURE
  assert png[12:16] == b"IHDR"
  width, height = struct.unpack(">II", png[16:24])
  # Panels: train/loss, eval/mlm_accuracy, eval/mlm_loss (the baseline is
  # not a curve): one row of three.
  assert (width, height) == (1500, 360)
  pixels = mpimg.imread(str(out / "curves.png"))
  assert pixels.shape[:2] == (height, width)
  assert pixels.std() > 0  # something was drawn


def test_the_fine_tuning_stage_is_the_downstream_column(runs, tmp_path):
  share_all = runs[0]
  for name, acc in (("finetune", 0.9375), ("finetune_random_init", 0.875)):
    os.makedirs(f"{share_all}/{name}")
    with open(f"{share_all}/{name}/final_metrics.json", "w") as f:
      json.dump({"step": 5, "eval_accuracy": 0.5, "eval_test/accuracy": acc,
                 "eval_test/majority_baseline_accuracy": 0.625}, f)
  loaded = [report.load_run(r) for r in runs]
  assert report.downstream(share_all) == {
      "downstream_test/accuracy": 0.9375, "random_init_test/accuracy": 0.875}
  assert report.eval_metric_names(loaded)[-2:] == [
      "downstream_test/accuracy", "random_init_test/accuracy"]
  table = report.report_table(loaded).splitlines()
  assert table[0].endswith("| downstream_test/accuracy "
                           "| random_init_test/accuracy | params | train FLOPs |")
  assert "| 0.0625 | 0.9375 | 0.875 | " in table[2]
  assert "| 0.0625 |  |  | " in table[3]  # share=none has no fine-tune


def test_curve_panels_and_run_scalars(runs):
  loaded = [report.load_run(r) for r in runs]
  assert report.curve_tags(loaded) == [
      "train/loss", "eval/mlm_accuracy", "eval/mlm_loss"]
  assert loaded[0].scalars["train/loss"] == [(10, 7.0), (20, 6.5), (30, 6.0)]
  assert loaded[0].scalars["eval/mlm_accuracy"] == [(15, 0.0625), (30, 0.125)]
  assert report.varied_keys(loaded[:1]) == []
  assert report.varied_keys(loaded[:2]) == ["model.share"]


def test_same_names_from_two_sweeps_are_told_apart(runs, tmp_path):
  other = tmp_path / "other"
  other.mkdir()
  copy = other / "share=all"
  shutil.copytree(runs[0], copy)
  loaded = [report.load_run(p) for p in (runs[0], str(copy), runs[1])]
  assert [r.name for r in loaded] == ["share=all", "share=all", "share=none"]
  report._unique_names(loaded)  # pylint: disable=protected-access
  assert [r.name for r in loaded] == [runs[0], str(copy), runs[1]]


def _remove(path):
  for f in glob.glob(path):
    os.remove(f)


def _corrupt_last_line(run):
  """Cuts the closing brace off the last line of a run's metrics.jsonl."""
  path = pathlib.Path(run, "tensorboard", metrics.METRICS_FILE)
  path.write_text(path.read_text()[:-2] + "\n")


@pytest.mark.parametrize("broken,message", [
    (lambda d: _remove(f"{d}/config.json"),
     "is not a finished pre-training run (a workdir of python -m "
     "albert_jax.main): it has no config.json."),
    (lambda d: _remove(f"{d}/final_metrics.json"),
     "it has no final_metrics.json, which the trainer writes when training "
     "ends; rerun the same command to finish it."),
    (lambda d: _remove(f"{d}/tensorboard/metrics.jsonl"),
     "/tensorboard/metrics.jsonl."),
    (lambda d: pathlib.Path(d, "final_metrics.json").write_text("{step"),
     "final_metrics.json is not valid JSON"),
    (lambda d: pathlib.Path(d, "config.json").write_text(
        '{"job": "finetune"}'),
     "is a finetune run; the report compares pre-training runs."),
    (_corrupt_last_line,
     "/tensorboard/metrics.jsonl: line 2 is not a logged step: "),
])
def test_a_dir_that_is_not_a_run_is_named(runs, tmp_path, capsys, broken,
                                          message):
  broken(runs[1])
  assert report.main([*runs, f"--out={tmp_path / 'out'}"]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"report: {os.path.normpath(runs[1])}")
  assert message in err, err
  assert not (tmp_path / "out" / "report.md").exists()


def test_command_line_refuses_a_missing_dir(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "albert_jax.tools.report", str(tmp_path / "nope")],
      capture_output=True, text=True, check=False, cwd=tmp_path,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 2
  assert without_plugin_noise(result.stderr) == (
      f"report: {tmp_path}/nope is not a directory; give the workdirs of "
      "pre-training runs (e.g. a sweep's WORKDIR_ROOT/*/).\n")
  assert not list(tmp_path.iterdir())


def test_electra_runs_count_the_discriminator():
  """An ELECTRA run's parameters are its discriminator's encoder (no pooler,
  no generator), equal to transformers' ElectraModel."""
  transformers = pytest.importorskip("transformers")
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(
      "electra_small", CONFIGS / "electra_small.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config().to_dict()
  run = report.Run(name="e", path="/nonexistent", config=config, final={},
                   scalars={})
  import torch  # pylint: disable=g-import-not-at-top
  with torch.device("meta"):
    hf = transformers.ElectraModel(transformers.ElectraConfig(
        vocab_size=30522, embedding_size=128, hidden_size=256,
        num_hidden_layers=12, num_attention_heads=4, intermediate_size=1024))
  assert report.parameter_count(run) == sum(p.numel() for p in hf.parameters())
