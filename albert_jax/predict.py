"""Predicts with a fine-tuned model on a file of inputs.

  python -m albert_jax.predict --model=WORKDIR --input=FILE --output=OUT.jsonl

FILE is TSV, CSV or JSONL (optionally .gz), OUT JSONL (optionally .gz);
all three may be gs:// paths. With several devices, prediction is sharded
as the run's training was; `--num_fake_devices=N` stands N CPU devices in
for them. The model and its featurization are
`albert_jax.finetune.predict`; the file streaming
`albert_jax.finetune.predict_files`.
"""

import argparse
import sys
from typing import Sequence

# Importing the training command line applies sys.argv's --num_fake_devices
# (`main._early_fake_devices`) before anything imports JAX, so the flag
# means here what it means there.
import albert_jax.main  # noqa: F401  pylint: disable=unused-import
# isort: split
import jax

from albert_jax.finetune import predict
from albert_jax.finetune import predict_files
from albert_jax.finetune import tabular
from albert_jax.finetune.predict_tasks import PredictError


def main(argv: Sequence[str] | None = None) -> int:
  """`python -m albert_jax.predict --model=DIR --input=FILE --output=FILE`."""
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
  from albert_jax.interop import CheckpointError  # pylint: disable=g-import-not-at-top
  step = args.step
  if step not in (None, "best"):
    try:
      step = int(step)
    except ValueError:
      parser.error(f"--step={step!r}: give 'best' or a step number.")
  try:
    model = predict.load(args.model, step)
    count = predict_files.predict_file(
        model, args.input, args.output,
        columns=args.columns.split(",") if args.columns else None,
        header=args.header.split(",") if args.header else None,
        batch_size=args.batch_size, progress=not args.no_progress)
  except (CheckpointError, PredictError, tabular.FileFormatError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  where = ("" if model.mesh is None
           else f"; mesh {predict.mesh_description(model.mesh)}")
  print(f"{count} predictions written to {args.output} (step {model.step} "
        f"of {args.model}{where}).", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
