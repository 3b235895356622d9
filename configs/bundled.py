r"""Fine-tunes on a bundled labelled task, as the demo's last stage does.

  python -m albert_jax.main --config=configs/bundled.py:task=spam \
      --config.init=/tmp/albert_demo --workdir=/tmp/spam

`task=` `source` (default: which corpus a held-out sentence comes from,
bundled/labeled/corpus_source.tsv.gz; 6% of its rows train, 24% eval, 70%
test) or `spam` (the SpamAssassin e-mails, 80/10/10); the file is cut by
`config.seed` into stratified train/eval/test files in the workdir.
`steps=N` (default 150). The downstream suite's `--suite=bundled` runs both
over seeds (albert_jax.tools.downstream).
"""

from albert_jax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, task="source", steps=150)
  return config_lib.bundled_task_config(args.task, args.steps)
