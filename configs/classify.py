r"""Fine-tunes a classifier (or regressor) on your own TSV/CSV/JSONL files.

  python -m albert_jax.main --config=configs/classify.py \
      --config.init=/path/to/pretrained \
      --config.data.train_file=train.tsv --config.data.eval_file=dev.tsv \
      --config.data.text_column=text --config.data.label_column=label \
      --workdir=/tmp/my_task

Sentence pairs: `--config.data.text_columns="('question','answer')"`.
Regression: `--config.data.task_type=regression`. A test file
(`--config.data.test_file`) is predicted with the best checkpoint; files go
to `workdir/predictions`. Every key the files task reads is listed in
albert_jax/finetune/tasks/classification/files.py.

Arguments: `steps=N` (default 1000), `lr=X` (default 2e-5), `batch=N`
(default 32), `seq=N` (default 128).
"""

from albert_jax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, steps=1000, lr=2e-5, batch=32, seq=128)
  c = config_lib.classify_config(
      learning_rate=args.lr, batch_size=args.batch,
      num_train_steps=args.steps, warmup_steps=max(args.steps // 10, 1),
      max_seq_length=args.seq)
  c.eval_every_steps = c.checkpoint_every_steps = max(args.steps // 5, 1)
  return c
