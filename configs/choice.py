r"""Fine-tunes multiple choice on your own files (SWAG-style).

  python -m albert_jax.main --config=configs/choice.py \
      --config.init=/path/to/pretrained --config.data.train_file=train.jsonl \
      --config.data.eval_file=dev.jsonl --config.data.choices_column=endings \
      --workdir=/tmp/my_choice

Rows hold a context, optionally a question (SWAG's "sent2", joined to each
ending), N endings (`choice_columns` or one JSONL list `choices_column`) and
the right ending's 0-based index; every key is listed in
albert_jax/finetune/tasks/multiple_choice/files.py.

Arguments: `steps=N` (default 1000), `lr=X` (default 2e-5), `batch=N`
(default 16), `seq=N` (default 128).
"""

import ml_collections

from albert_jax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, steps=1000, lr=2e-5, batch=16, seq=128)
  c = config_lib.finetune_config(
      "choice/files", learning_rate=args.lr, batch_size=args.batch,
      num_train_steps=args.steps, warmup_steps=max(args.steps // 10, 1),
      max_seq_length=args.seq, dropout=0.0)
  str_ = ml_collections.config_dict.placeholder(str)
  c.data.update(dict(
      train_file="", eval_file="", test_file=str_,
      context_column="context", question_column=str_,
      choice_columns=ml_collections.config_dict.placeholder(tuple),
      choices_column=str_, label_column="label", max_qa_length=64))
  c.eval_every_steps = c.checkpoint_every_steps = max(args.steps // 5, 1)
  return c
