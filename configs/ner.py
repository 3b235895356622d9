r"""Fine-tunes a named-entity tagger: CoNLL-2003 from TFDS, or your own files.

  python -m albert_jax.main --config=configs/ner.py \
      --config.init=/path/to/albert-base-v2 --workdir=/tmp/ner
  python -m albert_jax.main --config=configs/ner.py:source=files \
      --config.init=/path/to/pretrained --config.data.train_file=train.txt \
      --config.data.eval_file=dev.txt --workdir=/tmp/my_ner

Each word's tag is learned on its first sub-word; entity-level precision,
recall and F1 are conlleval's ("f1" selects the checkpoint). Files are in
CoNLL-2003 format (albert_jax/finetune/tasks/tagging/ner.py lists every key).

Arguments: `source=conll2003|files`, `steps=N` (default 3000), `lr=X`
(default 5e-5), `batch=N` (default 32), `seq=N` (default 128).
"""

import ml_collections

from albert_jax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, source="conll2003", steps=3000, lr=5e-5,
                              batch=32, seq=128)
  if args.source not in ("conll2003", "files"):
    raise ValueError(f"Unknown source {args.source!r}; choose conll2003 or "
                     "files.")
  c = config_lib.finetune_config(
      f"ner/{args.source}", learning_rate=args.lr, batch_size=args.batch,
      num_train_steps=args.steps, warmup_steps=max(args.steps // 10, 1),
      max_seq_length=args.seq, dropout=0.0)
  if args.source == "files":
    str_ = ml_collections.config_dict.placeholder(str)
    c.data.update(dict(train_file="", eval_file="", test_file=str_,
                       labels=ml_collections.config_dict.placeholder(tuple)))
  c.eval_every_steps = c.checkpoint_every_steps = max(args.steps // 5, 1)
  return c
