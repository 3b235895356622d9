r"""ELECTRA-Base: a 1/3-width generator and a 110M-parameter discriminator.

The discriminator is BERT-base in shape: vocab 30522, H=E=768 (no
projection), 12 layers, 12 heads, FFN 3072, nothing shared, exact gelu,
dropout 0.1. The generator has the same depth at a third of the width
(H=256, 4 heads, FFN 1024, its own 768→256 projection) and shares the
embeddings. Loss = MLM(generator) + 50 · replaced-token detection.
Token-level masking of 15% (85% [MASK], 15% kept; 79 slots), full-sentence
packing, sequences of 512, batch 256, AdamW at lr 2e-4 with 10k warmup steps
for 766k steps: the paper's ELECTRA-Base recipe.

Arguments: `tiny` (a tiny model, vocab 1000, H=E=48, 2 layers, and a
20-step CPU run, for smoke tests).

  python -m albert_jax.main --config=configs/electra_base.py \
      --workdir=/tmp/electra_base
"""

from albert_jax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, tiny=False)
  act = dict(hidden_act="gelu", mlm_hidden_act="gelu",
             hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
  if args.tiny:
    model = config_lib.tiny_model(share="none", projection=False,
                                  hidden_size=48, intermediate_size=96, **act)
  else:
    model = config_lib.model_config(
        vocab_size=30522, embedding_size=768, hidden_size=768,
        num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        max_position_embeddings=512, share="none",
        embedding_projection=False, **act)
  c = config_lib.electra_config(
      model, generator_fraction=1 / 3, learning_rate=2e-4, batch_size=256,
      num_train_steps=766_000, warmup_steps=10_000, max_seq_length=512,
      max_predictions=79)
  if args.tiny:
    config_lib.smoke_run(c)
  return c
