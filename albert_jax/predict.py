"""Predicts with a fine-tuned model on a file of inputs.

  python -m albert_jax.predict --model=WORKDIR --input=FILE --output=OUT.jsonl

FILE is TSV, CSV or JSONL (optionally .gz), OUT JSONL (optionally .gz);
all three may be gs:// paths. With several devices, prediction is sharded
as the run's training was; `--num_fake_devices=N` stands N CPU devices in
for them. The logic is in `albert_jax.finetune.serving.prediction_files`.
"""

import sys

# Importing the training command line applies sys.argv's --num_fake_devices
# (`main._early_fake_devices`) before anything imports JAX, so the flag
# means here what it means there.
import albert_jax.main  # noqa: F401  pylint: disable=unused-import
# isort: split
from albert_jax.finetune.serving import prediction_files

if __name__ == "__main__":
  sys.exit(prediction_files.main())
