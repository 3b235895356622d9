r"""A tiny ALBERT (79k parameters) for tests, demos and smoke runs on CPU.

vocab 1000, E=32, H=64, 2 layers, 4 heads, FFN 128, 128 positions. Every
dimension differs, so a transposed weight fails loudly rather than silently.
The run is CPU-sized too: batch 8, 100 steps (10 warmup), sequences of 128,
evaluated (2 batches) and checkpointed every 50 steps.

Arguments (`:k=v,k2=v2` after the file name), each a ModelConfig field that
changes the model's structure, so one small file covers every variant:
  share=all|attention|ffn|none  which parameters are shared (default all).
  groups=N       num_hidden_groups (shared parameters only).
  inner=N        inner_group_num: blocks applied per layer.
  layers=N       num_hidden_layers (default 2).
  projection=false  no E→H projection (embedding width becomes H); with
                 share=none this is a tiny BERT.
  dropout=P      hidden and attention dropout (default 0).
  act=NAME       hidden_act (default gelu_new).
  dtype=NAME     compute dtype (default float32).

  python -m albert_jax.tools.summary --config=configs/tiny.py
  python -m albert_jax.tools.summary --config=configs/tiny.py:share=none
  python -m albert_jax.tools.summary --config=configs/tiny.py:layers=4,groups=2
"""

from albert_jax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(
      arg, share="all", groups=1, inner=1, layers=2, projection=True,
      dropout=0.0, act="gelu_new", dtype="float32")
  model = config_lib.tiny_model(
      share=args.share, projection=args.projection,
      num_hidden_groups=args.groups, inner_group_num=args.inner,
      num_hidden_layers=args.layers, hidden_dropout_prob=args.dropout,
      attention_probs_dropout_prob=args.dropout, hidden_act=args.act,
      dtype=args.dtype)
  # Sequences as long as the 128 positions the tiny model has; a run CPU
  # finishes in a minute or two (the paper's batch of 4096 for 125k steps
  # took 10 GB and minutes before its first step): 8 sequences a step, 100
  # steps, evaluated and checkpointed every 50.
  c = config_lib.base_config(model, max_seq_length=128, batch_size=8,
                             num_train_steps=100, warmup_steps=10)
  c.log_every_steps = 10
  c.eval_every_steps = c.checkpoint_every_steps = 50
  c.eval_batches = 2
  return c
