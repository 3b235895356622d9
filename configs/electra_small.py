r"""ELECTRA-Small: a 1/4-width generator and a 14M-parameter discriminator.

The discriminator: vocab 30522, E=128 projected to H=256, 12 layers, 4
heads, FFN 1024, nothing shared, exact gelu, dropout 0.1. The generator has
the same depth at a quarter of the width (H=64, 1 head, FFN 256) and shares
the embeddings. Loss = MLM(generator) + 50 · replaced-token detection.
Token-level masking of 15% (85% [MASK], 15% kept), full-sentence packing,
sequences of 128, batch 128, AdamW at lr 5e-4 with 10k warmup steps for 1M
steps: the paper's ELECTRA-Small recipe. The tokenizer is trained in the
workdir unless config.data.tokenizer names one (e.g. BERT's uncased
vocab.txt, the paper's).

Arguments: `tiny` (a tiny model, vocab 1000, E=32, H=64, 2 layers, and a
20-step CPU run, for smoke tests).

  python -m albert_jax.main --config=configs/electra_small.py \
      --workdir=/tmp/electra_small
  python -m albert_jax.main --config=configs/electra_small.py:tiny \
      --config.fast_compile=True --workdir=/tmp/electra_tiny
"""

from albert_jax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, tiny=False)
  # ELECTRA's generator head, like its discriminator, uses exact gelu.
  act = dict(hidden_act="gelu", mlm_hidden_act="gelu",
             hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
  if args.tiny:
    model = config_lib.tiny_model(share="none", projection=True, **act)
  else:
    model = config_lib.model_config(
        vocab_size=30522, embedding_size=128, hidden_size=256,
        num_hidden_layers=12, num_attention_heads=4, intermediate_size=1024,
        max_position_embeddings=512, share="none", embedding_projection=True,
        **act)
  c = config_lib.electra_config(
      model, generator_fraction=0.25, learning_rate=5e-4, batch_size=128,
      num_train_steps=1_000_000, warmup_steps=10_000, max_seq_length=128,
      max_predictions=20)
  if args.tiny:
    config_lib.smoke_run(c)
  return c
