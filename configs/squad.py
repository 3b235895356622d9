r"""Fine-tunes on SQuAD v1.1 or v2.0 with the ALBERT paper's Table 14 settings.

  python -m albert_jax.main --config=configs/squad.py:version=2.0 \
      --config.init=/path/to/albert-base-v2 --workdir=/tmp/squad2

Features as the official run_squad: doc stride 128, query length 64, n-best
20, answers up to 30 tokens. v2.0 uses the official ALBERT head (end logits
conditioned on the start, answer-class logit, 5×5 beam);
`--config.data.v2_head=simple` selects the null-span ([CLS]) variant. Writes
`predictions.json`, `nbest_predictions.json` and, for v2.0, `null_odds.json`
into `workdir/predictions`, with the null threshold tuned on dev.

Arguments: `version=1.1|2.0`.
"""

from albert_jax import config_lib

# Table 14: learning rate, batch, dropout, train steps, warmup, max length.
TABLE_14 = {
    "1.1": (5e-5, 48, 0.0, 3649, 365, 384),
    "2.0": (3e-5, 48, 0.0, 8144, 814, 512),
}


def get_config(arg=None):
  args = config_lib.parse_arg(arg, version="2.0")
  c = config_lib.table_14_config(TABLE_14, args.version,
                                 task=f"squad/v{args.version}",
                                 what="SQuAD version")
  c.data.doc_stride = 128
  c.data.max_query_length = 64
  c.data.n_best_size = 20
  c.data.max_answer_length = 30
  c.data.v2_head = "official"
  c.eval_every_steps = c.checkpoint_every_steps = max(
      c.num_train_steps // 4, 50)
  return c
