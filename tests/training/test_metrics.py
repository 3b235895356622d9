"""TensorBoard events and metrics.jsonl, the progress bar and the MFU peak
table."""

import glob
import io
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from tensorboardX import record_writer

from albert_jax import storage
from albert_jax.model import flops
from albert_jax.model.config import ModelConfig
from albert_jax.training import metrics
from albert_jax.training import pretrain


def _write_two_steps(logdir):
  w = metrics.Writer(str(logdir))
  w.write(3, {"train/loss": 1.5, "eval/mlm_accuracy": 0.25})
  w.write(7, {"train/loss": 1.25, "train/mfu": None, "bad": float("nan")})
  w.close()


def test_event_file_is_readable_by_tensorflow(tmp_path):
  tf = pytest.importorskip("tensorflow")
  from tensorflow.core.util import event_pb2  # pylint: disable=g-import-not-at-top
  _write_two_steps(tmp_path)
  (path,) = glob.glob(str(tmp_path / "events.out.tfevents.*"))
  # TFRecordDataset checks both CRCs of every record.
  events = [event_pb2.Event.FromString(r.numpy())
            for r in tf.data.TFRecordDataset(path)]
  assert events[0].file_version == "brain.Event:2"
  got = [(e.step, [(v.tag, v.simple_value) for v in e.summary.value])
         for e in events[1:]]
  assert got == [(3, [("train/loss", 1.5)]), (3, [("eval/mlm_accuracy", 0.25)]),
                 (7, [("train/loss", 1.25)])]
  assert all(abs(e.wall_time - time.time()) < 60 for e in events)


def test_metrics_jsonl_has_a_line_per_write(tmp_path):
  _write_two_steps(tmp_path)
  assert (tmp_path / "metrics.jsonl").read_text().splitlines() == [
      '{"step": 3, "train/loss": 1.5, "eval/mlm_accuracy": 0.25}',
      '{"step": 7, "train/loss": 1.25}']


def test_a_line_torn_by_a_kill_is_dropped_on_resume(tmp_path, caplog):
  """A run killed while appending leaves half a line; the resumed run's
  writer drops it (with a note), so the report reads every line after."""
  from albert_jax.tools import report  # pylint: disable=g-import-not-at-top
  _write_two_steps(tmp_path)
  with open(tmp_path / "metrics.jsonl", "a", encoding="utf-8") as f:
    f.write('{"step": 8, "train/lo')
  with caplog.at_level("WARNING"):
    w = metrics.Writer(str(tmp_path))
  assert "dropped its last line" in caplog.text
  assert '{"step": 8, "train/lo' in caplog.text
  w.write(9, {"train/loss": 1.0})
  w.close()
  assert report.read_scalars(str(tmp_path))["train/loss"] == [
      (3, 1.5), (7, 1.25), (9, 1.0)]


def test_a_torn_line_is_dropped_in_the_bucket_too(gcs_bucket):
  logdir = f"{gcs_bucket}/run/tensorboard"
  jsonl = storage.path(f"{logdir}/metrics.jsonl")
  jsonl.write_text('{"step": 3, "train/loss": 1.5}\n{"step": 4, "tr')
  w = metrics.Writer(logdir)
  w.write(5, {"train/loss": 1.25})
  w.close()
  assert jsonl.read_text() == ('{"step": 3, "train/loss": 1.5}\n'
                               '{"step": 5, "train/loss": 1.25}\n')


def test_a_resumed_runs_metrics_are_appended_in_the_bucket(gcs_bucket):
  """On gs:// too: a second writer (the resumed run) keeps the first's lines,
  and each line is in the bucket as soon as it is written."""
  logdir = f"{gcs_bucket}/run/tensorboard"
  jsonl = storage.path(f"{logdir}/metrics.jsonl")
  first = metrics.Writer(logdir)
  first.write(3, {"train/loss": 1.5})
  assert jsonl.read_text() == '{"step": 3, "train/loss": 1.5}\n'
  first.close()
  second = metrics.Writer(logdir)
  second.write(7, {"train/loss": 1.25})
  second.close()
  assert jsonl.read_text().splitlines() == [
      '{"step": 3, "train/loss": 1.5}', '{"step": 7, "train/loss": 1.25}']


def test_gs_event_files_go_through_epath(tmp_path):
  metrics.Writer(str(tmp_path)).close()
  assert isinstance(record_writer.REGISTERED_FACTORIES["gs"],
                    metrics._EpathEventFiles)  # pylint: disable=protected-access
  path = tmp_path / "events"
  f = metrics._EpathEventFile(str(path))  # pylint: disable=protected-access
  f.write(b"ab")
  assert not path.exists()
  f.flush()
  assert path.read_bytes() == b"ab"
  f.write(b"cd")
  f.close()
  assert path.read_bytes() == b"abcd"
  path.unlink()
  f.flush()
  f.close()  # nothing is written after close
  assert not path.exists()


def test_the_writer_does_not_import_torch_and_leaves_it_importable(tmp_path):
  # A fresh process: tensorboardX (imported by this module) would import
  # torch where it is installed, seconds at every run's start.
  pytest.importorskip("torch")
  code = (
      "import sys\n"
      "from albert_jax.training import metrics\n"
      f"w = metrics.Writer({str(tmp_path)!r})\n"
      "w.write(1, {'train/loss': 2.0}); w.close()\n"
      "assert 'torch' not in sys.modules, 'torch was imported'\n"
      "import torch\n"
      "print(torch.ones(2).sum().item())\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, timeout=120,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip() == "2.0"
  assert glob.glob(str(tmp_path / "events.out.tfevents.*"))


def test_disabled_writer_writes_nothing(tmp_path):
  w = metrics.Writer(str(tmp_path / "x"), enabled=False)
  w.write(1, {"a": 1.0})
  w.close()
  assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("kind,peak", [
    ("TPU v4", 275.0), ("TPU v5 lite", 197.0), ("TPU v5p", 459.0),
    ("TPU v6 lite", 918.0), ("TPU v3", 123.0), ("NVIDIA H100 80GB HBM3", 989.0),
    ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.0), ("cpu", None)])
def test_peak_lookup(kind, peak):
  assert metrics.peak_tflops(kind) == peak
  assert metrics.peak_tflops(kind, override=100.0) == 100.0


def test_mfu_formula():
  cfg = ModelConfig(vocab_size=100, embedding_size=8, hidden_size=16,
                    num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=16)
  per_step = flops.training_flops_per_step(cfg, 4, 16, 3)
  # Half of 2 devices' peak achieved when a step takes per_step/peak seconds.
  peak = 1e12
  assert flops.mfu(per_step, per_step / peak, 2 * peak) == pytest.approx(0.5)


def test_progress_lines_without_a_terminal():
  out = io.StringIO()
  p = metrics.Progress(total=20, start=0, stream=out, every=10)
  for step in range(1, 21):
    p.update(step, {"loss": 2.0 - step / 20, "seq_per_sec": 8.0})
  lines = out.getvalue().splitlines()
  assert len(lines) == 2
  assert lines[0].startswith("10/20 ") and "loss 1.5" in lines[0]
  assert lines[1].startswith("20/20 ") and "ETA 0:00" in lines[1]
  assert "seq/s 8" in lines[1]


def test_final_summary_mentions_baseline():
  text = metrics.final_summary({
      "step": 400, "eval_mlm_accuracy": 0.1, "eval_mlm_loss": 5.0,
      "eval_sop_accuracy": 0.55, "eval_unigram_baseline_accuracy": 0.05})
  assert "MLM accuracy 0.1000 (unigram-frequency baseline 0.0500)" in text
  assert "SOP accuracy 0.5500 (chance 0.5)" in text
  assert "SIGTERM" in metrics.final_summary({"preempted_at": 7})
  assert "Stopped by SIGINT after step 7" in metrics.final_summary(
      {"preempted_at": 7, "stopped_by": "SIGINT"})
  text = metrics.final_summary({
      "step": 400, "eval_sop_accuracy": 0.51953125,
      "eval_sentence_majority_share": 0.51953125})
  assert "SOP accuracy 0.5195 (majority-class share 0.5195)" in text


def test_final_summary_sets_the_fine_tune_beside_random_init():
  finetune = {"task": "files", "data": "spam.tsv", "step": 150,
              "best_step": 150, "eval_accuracy": 0.9,
              "eval_test/accuracy": 0.9375,
              "eval_test/majority_baseline_accuracy": 0.6875}
  random = {**finetune, "eval_test/accuracy": 0.875}
  predicted = {**finetune, "new_predictions": [
      {"text": "Call me Ishmael, said the stranger at the inn.",
       "label": "moby_dick", "probability": 0.8125},
      {"text": "a rating", "score": 3.25}]}
  text = metrics.final_summary({"step": 400, "finetune": predicted,
                                "finetune_random_init": random})
  lines = text.splitlines()
  assert ("new text → moby_dick (probability 0.812): Call me Ishmael, said "
          "the stranger at the inn.") in lines
  assert "new text → score 3.2500: a rating" in lines
  assert lines[-1] == ("test/accuracy: pre-trained 0.9375, random init "
                       "0.8750 (+0.0625 from pre-training)")
  assert "The same fine-tune from random weights:" in lines
  assert lines.count("test/accuracy 0.9375 (majority-class baseline "
                     "0.6875)") == 1
  worse = metrics.final_summary({"step": 1, "finetune": random,
                                 "finetune_random_init": finetune})
  assert worse.splitlines()[-1] == (
      "test/accuracy: pre-trained 0.8750, random init 0.9375 (-0.0625 from "
      "pre-training)")


def test_eval_reports_the_sentence_labels_majority_share():
  """`pretrain.evaluate`: the share of the commoner sentence label over the
  evaluated rows (unlabelled rows, -1, not counted)."""
  class Loader:
    labels = [np.array([0, 0, 1, -1]), np.array([0, 1, 0, 0])]

    def batch(self, step):
      return step

    def local_batch(self, step):
      return {"sentence_labels": self.labels[step]}

  out = pretrain.evaluate(lambda params, batch: {"n": np.float32(1)}, None,
                          Loader(), 2, lambda sums: {"n": sums["n"]})
  assert out == {"n": 2.0, "sentence_majority_share": 5 / 7}
