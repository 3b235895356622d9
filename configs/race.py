r"""Fine-tunes on RACE with the ALBERT paper's Table 14 settings.

  python -m albert_jax.main --config=configs/race.py:subset=all \
      --config.init=/path/to/albert-base-v2 --workdir=/tmp/race

Four choices per question, each `[CLS] article [SEP] question option [SEP]`
with the question+option kept to 128 tokens; one logit per choice from the
pooled output, softmax over the choices. Reports accuracy on high, middle
and all, and writes the predictions into `workdir/predictions`.

Arguments: `subset=all|high|middle`.
"""

from albert_jax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, subset="all")
  if args.subset not in ("all", "high", "middle"):
    raise ValueError(f"Unknown RACE subset {args.subset!r}; choose all, "
                     "high or middle.")
  # Table 14 (the official README uses lr 1e-5 with the same schedule).
  c = config_lib.finetune_config(
      f"race/{args.subset}", learning_rate=2e-5, batch_size=32,
      num_train_steps=12000, warmup_steps=1000, max_seq_length=512,
      dropout=0.1)
  c.data.max_qa_length = 128
  c.eval_every_steps = c.checkpoint_every_steps = 2000
  return c
