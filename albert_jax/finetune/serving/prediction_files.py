"""Files of inputs → JSONL files of a fine-tuned model's predictions.

`predict_file` streams a TSV/CSV/JSONL(.gz) file's rows, a chunk at a time,
through `FineTuned.predict` (`albert_jax.finetune.serving.fine_tuned`) into a JSONL
file; `main` is its command line (`python -m albert_jax.predict`).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import sys
from typing import Iterable, Iterator, Sequence

from albert_jax import storage
from albert_jax.finetune import registry
from albert_jax.finetune import tabular
from albert_jax.finetune.task_type import PredictError


def _chunks(rows: Iterable, size: int) -> Iterator[list]:
  chunk = []
  for row in rows:
    chunk.append(row)
    if len(chunk) == size:
      yield chunk
      chunk = []
  if chunk:
    yield chunk


def check_request(input_path: str, output_path: str, batch_size: int) -> None:
  """Refuses, before anything is read or written, a request that would
  destroy its own input or cannot run.

  Raises:
    PredictError: the output is the input, its folder does not exist, or
      `batch_size` is not a whole number >= 1.
  """
  if not isinstance(batch_size, int) or batch_size < 1:
    raise PredictError(f"--batch_size={batch_size} must be a whole number "
                       ">= 1, e.g. --batch_size=32.")
  if storage.same_file(input_path, output_path):
    raise PredictError(f"--output={output_path} is the input file; writing "
                       "the predictions there would destroy it. Give "
                       "another --output, e.g. --output=predictions.jsonl.")
  folder = os.path.dirname(os.path.abspath(os.path.expanduser(
      os.fspath(output_path))))
  if not storage.is_remote(output_path) and not os.path.isdir(folder):
    raise PredictError(f"--output={output_path}: its folder {folder} does "
                       f"not exist; create it (mkdir -p {folder}) or write "
                       "into an existing folder.")


def predict_file(model, input_path: str, output_path: str, *,
                 columns: Sequence[str] | None = None,
                 header: Sequence[str] | None = None, batch_size: int = 32,
                 chunk_rows: int = 1024, progress: bool = True) -> int:
  """Streams a TSV/CSV/JSONL(.gz) file's rows through `model.predict` (a
  `FineTuned`'s) into a JSONL file, one {"row": i, ...prediction} line per
  input row.

  At most `chunk_rows` rows are held at a time, so memory stays bounded
  whatever the file's size. Rows become inputs by the model's task type
  (`TaskType.file_input`); columns default to those the task was trained
  on (classification: its text columns; question answering: "question"
  and "context"; multiple choice: "context", "question", "choices" or the
  trained ending columns; tagging: "text" or "tokens"). An output ending in
  .gz is gzipped. Both paths may be gs://. The output appears under its
  name only when every row is written (`storage.open_atomic`): a failing
  or killed run leaves an earlier file there as it was.

  Returns:
    The number of rows predicted.

  Raises:
    PredictError: a row the model cannot read (names its line), or a
      request `check_request` refuses.
  """
  check_request(input_path, output_path, batch_size)
  rows = tabular.iter_rows(input_path, header, "--input")
  kind = registry.task_type(model.task_type)
  total = 0
  bar = _progress(progress, input_path)
  with storage.open_atomic(output_path) as raw, (
      gzip.GzipFile(fileobj=raw, mode="wb", mtime=0)
      if os.fspath(output_path).endswith(".gz")
      else contextlib.nullcontext(raw)) as out:
    for chunk in _chunks(rows, chunk_rows):
      inputs = []
      for line, row in chunk:
        try:
          inputs.append(kind.file_input(row, model.settings, columns))
        except PredictError as e:
          raise PredictError(f"{input_path}, line {line}: {e}") from None
      try:
        results = model.predict(inputs, batch_size=batch_size)
      except PredictError as e:
        raise PredictError(f"{input_path}, lines {chunk[0][0]}-"
                           f"{chunk[-1][0]}: {e}") from None
      text = "".join(json.dumps({"row": total + i, **r}, ensure_ascii=False)
                     + "\n" for i, r in enumerate(results))
      out.write(text.encode("utf-8"))
      total += len(results)
      if bar is not None:
        bar.update(len(results))
  if bar is not None:
    bar.close()
  return total


def _progress(enabled: bool, what: str):
  """A tqdm bar counting rows on stderr, or None."""
  if not enabled:
    return None
  from tqdm import auto as tqdm  # pylint: disable=g-import-not-at-top
  return tqdm.tqdm(desc=os.path.basename(os.fspath(what)), unit=" rows",
                   file=sys.stderr, mininterval=1.0)


def main(argv: Sequence[str] | None = None) -> int:
  """`python -m albert_jax.predict --model=DIR --input=FILE --output=FILE`."""
  import argparse  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(
      prog="python -m albert_jax.predict",
      description="Predicts with a fine-tuned model on a TSV/CSV/JSONL(.gz) "
      "file, writing one JSON line per row.")
  parser.add_argument("--model", required=True,
                      help="a fine-tuning workdir (local or gs://)")
  parser.add_argument("--input", required=True,
                      help="TSV, CSV or JSONL, optionally .gz")
  parser.add_argument("--output", required=True,
                      help="JSONL (.jsonl or .jsonl.gz)")
  parser.add_argument("--step", default=None,
                      help="'best', a step number, or the newest (default)")
  parser.add_argument("--columns", default=None,
                      help="comma-separated input columns, in the order the "
                      "task reads them (default: the trained ones)")
  parser.add_argument("--header", default=None,
                      help="comma-separated column names of a TSV/CSV "
                      "without a header row")
  parser.add_argument("--batch_size", type=int, default=32,
                      help="rows per forward pass; with several devices, "
                      "rounded up to a multiple of the data axes' size")
  parser.add_argument("--pack", type=int, default=None,
                      help="inputs a row holds, each read alone: 0 for one; "
                      "default up to 8 where the model's rows can hold "
                      "several (classification and regression)")
  parser.add_argument("--no_progress", action="store_true")
  parser.add_argument("--num_fake_devices", type=int, default=0,
                      help="use N CPU devices (set before JAX starts, by "
                      "`python -m albert_jax.predict`) to predict sharded "
                      "as on N accelerators")
  args = parser.parse_args(argv)
  fake = args.num_fake_devices
  if fake < 0:
    parser.error(f"--num_fake_devices={fake} must be a whole number >= 0, "
                 "e.g. --num_fake_devices=8")
  if fake > 0 and jax.device_count() != fake:
    parser.error(f"--num_fake_devices={fake} takes effect only as JAX "
                 f"starts, but it has started with {jax.device_count()} "
                 "device(s); pass it to `python -m albert_jax.predict`.")
  from albert_jax.finetune.serving import fine_tuned as predict_lib  # pylint: disable=g-import-not-at-top
  from albert_jax.interop import CheckpointError  # pylint: disable=g-import-not-at-top
  step = args.step
  if step not in (None, "best"):
    try:
      step = int(step)
    except ValueError:
      parser.error(f"--step={step!r}: give 'best' or a step number.")
  try:
    check_request(args.input, args.output, args.batch_size)
    model = predict_lib.load(args.model, step, pack=args.pack)
    count = predict_file(
        model, args.input, args.output,
        columns=args.columns.split(",") if args.columns else None,
        header=args.header.split(",") if args.header else None,
        batch_size=args.batch_size, progress=not args.no_progress)
  except (CheckpointError, PredictError, tabular.FileFormatError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  where = ("" if model.mesh is None
           else f"; mesh {predict_lib.mesh_description(model.mesh)}")
  print(f"{count} predictions written to {args.output} (step {model.step} "
        f"of {args.model}{where}).", file=sys.stderr)
  return 0
