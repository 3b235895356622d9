"""What users see: TensorBoard events and metrics.jsonl, a console progress
bar, MFU.

MFU (model FLOPs utilisation) = analytic training FLOPs per step
(`albert_jax.model.flops.training_flops_per_step`: 3 × forward matmul FLOPs,
remat and padding not credited) ÷ step time ÷ (peak FLOP/s per device ×
devices). Peaks are dense bf16 matrix throughput per chip from the vendors'
data sheets; `config.peak_tflops_per_device` overrides the lookup (needed on
CPU, where no peak is defined and MFU is not reported).
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import sys
import time
from typing import Any, Mapping

from etils import epath

log = logging.getLogger(__name__)

# Beside the event files: one JSON object per `Writer.write`, {"step": ...,
# tag: value, ...}; `python -m albert_jax.tools.report` reads it.
METRICS_FILE = "metrics.jsonl"

# Dense bf16 TFLOP/s per chip (per device as JAX counts them).
PEAK_TFLOPS = {
    "TPU v3": 123.0,
    "TPU v4": 275.0,
    "TPU v5 lite": 197.0,   # v5e
    "TPU v5e": 197.0,
    "TPU v5p": 459.0,
    "TPU v5": 459.0,
    "TPU v6 lite": 918.0,   # v6e (Trillium)
    "TPU v6e": 918.0,
    "NVIDIA H100": 989.0,   # SXM; PCIe is 756
    "NVIDIA H200": 989.0,
}


def peak_tflops(device_kind: str, override: float = 0.0) -> float | None:
  """Peak TFLOP/s for a `jax.Device.device_kind`, or None if unknown."""
  if override and override > 0:
    return float(override)
  best = None
  for name, peak in PEAK_TFLOPS.items():
    if device_kind.startswith(name) and (best is None or len(name) > best[0]):
      best = (len(name), peak)
  if best is None:
    return None
  if device_kind.startswith("NVIDIA H100") and "PCIe" in device_kind:
    return 756.0
  return best[1]


def _import_tensorboardx():
  """(tensorboardX, tensorboardX.record_writer), imported without torch.

  tensorboardX's writer module imports torch wherever it is installed, only
  to accept torch tensors as values: 1.5-2 s at every run's start, for
  scalars that are Python floats here. Unless the process has imported torch
  already, the import sees none (`sys.modules["torch"] = None` makes
  `import torch` raise ImportError, which tensorboardX catches); torch is
  importable again afterwards.
  """
  hidden = "torch" not in sys.modules
  if hidden:
    sys.modules["torch"] = None  # type: ignore[assignment]
  try:
    import tensorboardX  # pylint: disable=g-import-not-at-top
    from tensorboardX import record_writer  # pylint: disable=g-import-not-at-top
  finally:
    if hidden:
      del sys.modules["torch"]
  return tensorboardX, record_writer


class Writer:
  """Scalars to TensorBoard and to metrics.jsonl, in `logdir` (process 0 only).

  The event file comes from tensorboardX, whose thread flushes it every two
  minutes and on `close`; metrics.jsonl is flushed at every `write`. A gs://
  `logdir`'s event file is written through `etils.epath`.
  """

  def __init__(self, logdir: str, enabled: bool = True):
    self.enabled = enabled
    if not enabled:
      return
    tensorboardX, record_writer = _import_tensorboardx()
    record_writer.register_writer_factory("gs", _EpathEventFiles())
    epath.Path(logdir).mkdir(parents=True, exist_ok=True)
    self._events = tensorboardX.SummaryWriter(
        logdir, filename_suffix=f".{os.getpid()}")
    self._jsonl = _Appender(epath.Path(logdir, METRICS_FILE))

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    clean = {k: float(v) for k, v in scalars.items()
             if v is not None and math.isfinite(float(v))}
    for tag, value in clean.items():
      self._events.add_scalar(tag, value, step)
    self._jsonl.append(json.dumps({"step": step, **clean}) + "\n")

  def close(self) -> None:
    if self.enabled:
      self._events.close()
      self._jsonl.close()


class _Appender:
  """A text file that lines are appended to, each written through at once.

  Locally it is a file open for appending. A Cloud Storage object cannot be
  appended to (gcsfs would silently overwrite it, losing a resumed run's
  earlier lines), so there the whole text is kept and uploaded on each
  append: metrics.jsonl holds one short line per logging step.
  """

  def __init__(self, path: epath.Path):
    self._path = path
    self._local = None
    self._text = ""
    if not os.fspath(path).startswith("gs://"):
      _drop_torn_line(path)
      self._local = path.open("a", encoding="utf-8")
    elif path.exists():
      self._text = path.read_text(encoding="utf-8")
      cut = self._text.rfind("\n") + 1
      if cut < len(self._text):
        _note_torn_line(path, self._text[cut:])
        self._text = self._text[:cut]

  def append(self, line: str) -> None:
    if self._local is not None:
      self._local.write(line)
      self._local.flush()
    else:
      self._text += line
      self._path.write_text(self._text, encoding="utf-8")

  def close(self) -> None:
    if self._local is not None:
      self._local.close()


def _drop_torn_line(path: epath.Path) -> None:
  """Cuts a local file back to its last complete line: a run killed while
  appending leaves a line without its newline, which the next line appended
  would run into."""
  if not path.exists():
    return
  with open(path, "rb+") as f:
    size = f.seek(0, os.SEEK_END)
    if not size:
      return
    # Lines are short: the last complete one ends within the last 64 KiB.
    start = max(size - 65536, 0)
    f.seek(start)
    tail = f.read()
    if tail.endswith(b"\n"):
      return
    cut = tail.rfind(b"\n") + 1
    f.truncate(start + cut)
  _note_torn_line(path, tail[cut:].decode("utf-8", "replace"))


def _note_torn_line(path: epath.Path, torn: str) -> None:
  log.warning("%s: dropped its last line, cut short when the run writing it "
              "was killed: %r", path, torn[:80])


class _EpathEventFile:
  """A tensorboardX event file written through `etils.epath`.

  GCS objects cannot be appended to, so each flush uploads the whole file.
  (tensorboardX's own gs:// writer uploads again from `__del__`, after
  `close`, and hangs the exit for two minutes if the bucket is unreachable.)
  """

  def __init__(self, path: str):
    self._path = epath.Path(path)
    self._buffer = io.BytesIO()
    self._dirty = self._closed = False

  def write(self, data: bytes) -> None:
    self._buffer.write(data)
    self._dirty = True

  def flush(self) -> None:
    if self._dirty and not self._closed:
      self._path.write_bytes(self._buffer.getvalue())
      self._dirty = False

  def close(self) -> None:
    self.flush()
    self._closed = True


class _EpathEventFiles:
  """tensorboardX's `register_writer_factory` factory: `_EpathEventFile`s."""

  def open(self, path: str) -> _EpathEventFile:
    return _EpathEventFile(path)

  def directory_check(self, path: str) -> None:
    del path  # object stores have no directories to create


class Progress:
  """A one-line console progress bar: step, rate, throughput, loss, ETA.

  On a terminal it redraws in place; otherwise (logs, CI) it prints a line
  every `every` steps.
  """

  def __init__(self, total: int, start: int = 0, stream=sys.stderr,
               every: int = 50, enabled: bool = True):
    self.total, self.start = total, start
    self.stream, self.every, self.enabled = stream, every, enabled
    self.tty = hasattr(stream, "isatty") and stream.isatty()
    self._t0 = time.time()
    self._last = 0.0

  def update(self, step: int, info: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    now = time.time()
    done = step - self.start
    final = step >= self.total
    if self.tty and not final and now - self._last < 0.2:
      return
    if not self.tty and not final and step % self.every:
      return
    self._last = now
    rate = done / max(now - self._t0, 1e-9)
    eta = (self.total - step) / rate if rate > 0 else float("inf")
    width = 24
    filled = int(width * step / max(self.total, 1))
    bar = "█" * filled + "·" * (width - filled)
    parts = [f"{step}/{self.total} {bar}", f"{rate:.2f} it/s"]
    for key in ("seq_per_sec", "examples_per_sec", "real_tokens_per_sec",
                "padding_fraction",
                "loss", "mlm_accuracy", "sop_accuracy"):
      if key in info and info[key] is not None:
        parts.append(f"{key.replace('_per_sec', '/s')} {info[key]:.3g}")
    parts.append(f"ETA {duration(eta)}")
    line = " | ".join(parts)
    if self.tty:
      self.stream.write("\r" + line + ("\n" if final else ""))
    else:
      self.stream.write(line + "\n")
    self.stream.flush()


def duration(seconds: float) -> str:
  """h:mm:ss, or m:ss under an hour; "?" for an unknown time."""
  if not math.isfinite(seconds):
    return "?"
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _count(n: int, what: str) -> str:
  return f"{n} {what}{'s' * (n != 1)}"


def goodput_lines(summary: Mapping[str, Any]) -> list[str]:
  """A `goodput.Account.summary` as the final summary's lines: goodput,
  badput by cause (largest first), lost and slow steps."""
  from albert_jax.training import goodput  # pylint: disable=g-import-not-at-top
  sessions = summary["sessions"]
  if not sessions:
    return []
  lines = [f"Goodput {summary['goodput_percent']:.1f}% of "
           f"{duration(summary['wall_seconds'])} wall time"
           + (f" over {sessions} sessions" if sessions > 1 else "") + "."]
  causes = sorted(goodput.BADPUT, key=lambda c: -summary["seconds"][c])
  lines.append("Badput: " + (", ".join(
      f"{c.replace('_', ' ')} {summary['percent'][c]:.1f}% "
      f"({summary['seconds'][c]:.1f} s)"
      for c in causes if summary["seconds"][c] >= 0.05) or "none") + ".")
  if summary["lost_steps"]:
    lines.append(f"Lost progress: {_count(summary['lost_steps'], 'step')} "
                 "run again after a restart (past the checkpoint resumed "
                 "from).")
  if summary["slow_step_count"]:
    more = summary["slow_step_count"] - len(summary["slow_steps"])
    lines.append(
        f"{_count(summary['slow_step_count'], 'slow step')} (over "
        "config.goodput.slow_step_factor × the median): "
        + ", ".join(map(str, summary["slow_steps"]))
        + (f" and {more} more" if more > 0 else "") + ".")
  return lines


def final_summary(result: Mapping[str, Any]) -> str:
  """The closing lines of a run: MLM accuracy beside the unigram baseline,
  and where the wall time went."""
  spent = goodput_lines(result["goodput"]) if result.get("goodput") else []
  if "preempted_at" in result:
    return "\n".join([
        f"Stopped by {result.get('stopped_by') or 'SIGTERM'} after step "
        f"{result['preempted_at']}; the checkpoint is saved and the same "
        "command resumes."] + spent)
  lines = [f"Finished at step {result.get('step')}."]
  if "eval_mlm_accuracy" in result:
    lines.append(
        f"held-out MLM accuracy {result['eval_mlm_accuracy']:.4f} "
        f"(unigram-frequency baseline "
        f"{result.get('eval_unigram_baseline_accuracy', float('nan')):.4f}), "
        f"MLM loss {result['eval_mlm_loss']:.3f}")
  if "eval_sop_accuracy" in result:
    share = result.get("eval_sentence_majority_share")
    lines.append(f"held-out SOP accuracy {result['eval_sop_accuracy']:.4f} "
                 + (f"(majority-class share {share:.4f})" if share is not None
                    else "(chance 0.5)"))
  if "task" in result:  # a fine-tuning run
    lines[0] = (f"Fine-tuned on {result.get('data', result['task'])} to "
                f"step {result.get('step')}; best checkpoint: step "
                f"{result.get('best_step')}.")
    for key in sorted(result):
      if key.startswith("eval_") and not key.endswith(
          "majority_baseline_accuracy"):
        split_metric = key[len("eval_"):]
        line = f"{split_metric} {result[key]:.4f}"
        base = key.rsplit("/", 1)[0] + "/" if "/" in key else "eval_"
        baseline = result.get(f"{base}majority_baseline_accuracy")
        if split_metric.endswith("accuracy") and baseline is not None:
          line += f" (majority-class baseline {baseline:.4f})"
        lines.append(line)
    for p in result.get("new_predictions", ()):  # config.predict_texts
      shown = (f"{p['label']} (probability {p['probability']:.3f})"
               if "label" in p else f"score {p['score']:.4f}")
      lines.append(f"new text → {shown}: {p['text'][:70]}")
  lines += spent
  if "finetune" in result:
    lines += ["", final_summary(result["finetune"])]
  if "finetune_random_init" in result:
    lines += ["", "The same fine-tune from random weights:",
              final_summary(result["finetune_random_init"])]
    lines += [line for line in _gain(result["finetune"],
                                     result["finetune_random_init"])]
  return "\n".join(lines)


def _gain(pretrained: Mapping[str, Any], random: Mapping[str, Any]):
  """One line per test-set metric: pre-trained beside random init."""
  for key in sorted(pretrained):
    if (key.startswith("eval_test/") and key in random
        and not key.endswith("majority_baseline_accuracy")):
      a, b = pretrained[key], random[key]
      yield (f"{key[len('eval_'):]}: pre-trained {a:.4f}, random init "
             f"{b:.4f} ({'+' if a >= b else ''}{a - b:.4f} from pre-training)")
