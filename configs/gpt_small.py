r"""GPT-1 (Radford et al. 2018): the left-to-right baseline BERT argues against.

The same post-LN stack as BERT-base with causal attention and a next-token
head tied to the word embeddings (`config.pretraining="causal_lm"`): 12
layers, H=E=768, 12 heads, FFN 3072, exact gelu, dropout 0.1, LayerNorm eps
1e-5, 512 learned positions, no segment embeddings (type_vocab_size 1),
nothing shared. Adam with decoupled weight decay 0.01 (not on biases or
LayerNorm gains) and bias correction, lr 2.5e-4 warmed up linearly over
2000 updates and annealed to 0 on a cosine, batches of 64 rows of exactly
512 tokens cut from one token stream, as GPT-1 did (`data.objective="none"`
with `data.exact_length=True`: documents in order with a [SEP] between them,
every row full, sentences cut where a row ends; `exact_length=False` ends
rows at sentence ends instead, RoBERTa-style, and the loss skips the
padding).

Steps: the paper trains 100 epochs of BooksCorpus and gives no step count.
Here num_train_steps = epochs × corpus_tokens / (64 × 512), with
corpus_tokens = 1.04e9 by default: BooksCorpus's ~800M words at ~1.3 BPE
tokens per word, about 3.17M steps. Set `corpus_tokens` to the token count
the data preparation reports for your corpus.

Vocabulary: GPT-1's BPE has 40,478 pieces (40,000 merges); the trainer
trains its own SentencePiece model of that size on `config.data.corpus`.

Differences from GPT-1 that the shared stack brings: a LayerNorm after the
embedding sum (BERT's), one constant token-type vector added to every
embedding, and weights drawn from a normal truncated at ±2σ.

Arguments (`:k=v,k2=v2`):
  epochs=N          passes over the corpus (default 100).
  corpus_tokens=N   tokens per epoch (default 1040000000).
  tiny              a tiny causal model (vocab 1000, H=64, 2 layers) with
                    batch 8 × 64 tokens for 30 steps, fast-compiled on CPU:
                    for tests and smoke runs.

  python -m albert_jax.main --config=configs/gpt_small.py --workdir=/tmp/gpt \
      --config.data.corpus=/data/books/*.txt
  python -m albert_jax.main --config=configs/gpt_small.py:tiny \
      --workdir=/tmp/gpt_tiny
"""

from albert_jax import config_lib

SEQ_LEN = 512
BATCH = 64


def get_config(arg=None):
  args = config_lib.parse_arg(arg, epochs=100, corpus_tokens=1_040_000_000,
                              tiny=False)
  gpt = dict(hidden_act="gelu", hidden_dropout_prob=0.1,
             attention_probs_dropout_prob=0.1, layer_norm_eps=1e-5,
             type_vocab_size=1, causal=True)
  if args.tiny:
    model = config_lib.tiny_model(share="none", projection=False, **gpt)
    batch, seq_len, steps, warmup, lr = 8, 64, 30, 3, 1e-3
  else:
    model = config_lib.model_config(
        vocab_size=40478, embedding_size=768, hidden_size=768,
        num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        max_position_embeddings=SEQ_LEN, share="none",
        embedding_projection=False, **gpt)
    batch, seq_len, warmup, lr = BATCH, SEQ_LEN, 2000, 2.5e-4
    steps = round(args.epochs * args.corpus_tokens / (batch * seq_len))
  c = config_lib.base_config(
      model, objective="none", optimizer="adamw", learning_rate=lr,
      batch_size=batch, num_train_steps=steps, warmup_steps=warmup,
      max_seq_length=seq_len)
  c.pretraining = "causal_lm"
  c.data.exact_length = True
  c.optimizer.schedule = "cosine"
  c.optimizer.eps = 1e-8
  c.optimizer.bias_correction = True
  c.best_metric = "lm_accuracy"
  if args.tiny:
    c.log_every_steps = 10
    c.eval_every_steps = 15
    c.eval_batches = 2
    c.checkpoint_every_steps = 15
    c.keep_checkpoints = 2
    c.data.eval_fraction = 0.1
    c.fast_compile = True
  return c
