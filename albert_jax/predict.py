"""Predicts with a fine-tuned model on a file of inputs.

  python -m albert_jax.predict --model=WORKDIR --input=FILE --output=OUT.jsonl

FILE is TSV, CSV or JSONL (optionally .gz), OUT JSONL (optionally .gz);
all three may be gs:// paths. The logic is in `albert_jax.finetune.predict`.
"""

import sys

from albert_jax.finetune import predict

if __name__ == "__main__":
  sys.exit(predict.main())
