r"""RoBERTa-base (125M parameters): BERT-base trained RoBERTa's way.

The model is HF's roberta-base: vocab 50265 (byte-level BPE), H=E=768, 12
layers, 12 heads, FFN 3072, nothing shared, exact gelu, dropout 0.1, 514
positions counted from pad id 1 (so 512 tokens), one token type, LayerNorm
eps 1e-5. The recipe is the paper's (Liu et al., 2019; Table 9): masked LM
only, on FULL-SENTENCES instances (sentences packed up to the length,
crossing documents with an extra </s> between them; data.objective "none"),
masks drawn afresh every epoch, single tokens (no whole words or n-grams),
15% of them, 80/10/10; AdamW with bias correction, lr 6e-4, b2 0.98, eps
1e-6, weight decay 0.01, no gradient clipping, 24k warmup steps of 500k,
batch 8k sequences of 512. A byte-level BPE vocabulary is trained on the
corpus in the workdir (data.tokenizer_type "bpe"), or give roberta-base's
own as --config.data.tokenizer=DIR (its vocab.json + merges.txt or
tokenizer.json).

Differences from fairseq's recipe: the schedule decays linearly from step 0
with warmup on top (optim.albert_schedule), so warmup ends at 95% of the
peak rather than at the peak; LayerNorm and bias parameters get no weight
decay.

Argument: `size=base|tiny` (default base). `tiny` is a CPU-sized run of the
same recipe for tests and smoke runs: a 1000-piece BPE trained on the
bundled corpus, H=64, 2 layers, 4 heads, FFN 128, sequences of 128 (130
positions), batch 16, 40 steps.

  python -m albert_jax.tools.summary --config=configs/roberta_base.py
  python -m albert_jax.main --config=configs/roberta_base.py:size=tiny \
      --workdir=/tmp/roberta_tiny
"""

import math

from albert_jax import config_lib

SIZES = ("base", "tiny")


def _max_predictions(seq_len: int, prob: float = 0.15) -> int:
  """Enough slots for prob·seq_len targets, rounded up to a multiple of 8."""
  return 8 * math.ceil(math.ceil(prob * seq_len) / 8)


def roberta_model(vocab_size: int, hidden: int, layers: int, heads: int,
                  ffn: int, max_seq_length: int):
  """RoBERTa's model section: BERT's shape, HF roberta-base's details."""
  pad_id = 1
  return config_lib.model_config(
      vocab_size=vocab_size, embedding_size=hidden, hidden_size=hidden,
      num_hidden_layers=layers, num_attention_heads=heads,
      intermediate_size=ffn, hidden_act="gelu", mlm_hidden_act="gelu",
      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
      # Positions start after the pad id: pad_id + 1 + max length.
      max_position_embeddings=max_seq_length + pad_id + 1,
      position_ids_from_padding=True, pad_token_id=pad_id,
      type_vocab_size=1, layer_norm_eps=1e-5, share="none",
      embedding_projection=False)


def get_config(arg=None):
  args = config_lib.parse_arg(arg, size="base")
  if args.size not in SIZES:
    raise ValueError(f"Unknown RoBERTa size {args.size!r}; choose one of "
                     f"{SIZES}.")
  if args.size == "base":
    seq, batch, steps, warmup = 512, 8192, 500_000, 24_000
    model = roberta_model(50265, 768, 12, 12, 3072, seq)
  else:
    seq, batch, steps, warmup = 128, 16, 40, 4
    model = roberta_model(1000, 64, 2, 4, 128, seq)
  c = config_lib.base_config(
      model, objective="none", optimizer="adamw", learning_rate=6e-4,
      batch_size=batch, num_train_steps=steps, warmup_steps=warmup,
      max_seq_length=seq, max_predictions=_max_predictions(seq))
  c.data.tokenizer_type = "bpe"
  c.data.dynamic_masking = True
  c.masking.whole_word = False
  c.masking.max_ngram = 1
  c.masking.masked_lm_prob = 0.15
  c.optimizer.update(b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.01,
                     bias_correction=True, clip_norm=0.0)
  if args.size == "tiny":
    c.optimizer.learning_rate = 1e-3
    c.log_every_steps = 10
    c.eval_every_steps = c.checkpoint_every_steps = 20
    c.eval_batches = 2
  return c
