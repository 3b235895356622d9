r"""The demo: pre-train a small ALBERT on the bundled corpus, on CPU, in minutes.

Trains a SentencePiece vocabulary and prepares SOP instances in the workdir
on first use (reused on resume), then pre-trains with LAMB, checkpoints,
evaluates on held-out documents and prints MLM accuracy beside the
unigram-frequency baseline, and SOP accuracy beside the majority-class
share. It then fine-tunes the fresh model in `workdir/finetune` on a
downstream task, prints test accuracy beside the majority-class baseline,
reloads the best checkpoint as `albert_jax.load_pretrained(WORKDIR/finetune)`
would and predicts three new texts that are not in the data (label and
probability of each), then runs the same fine-tune from random weights in
`workdir/finetune_random_init` and prints what pre-training changed.

  python -m albert_jax.main --config=configs/demo.py --workdir=/tmp/albert_demo

Arguments: `steps=N` (pre-training steps, default 2000: the fewest measured
after which pre-training beats random init on the default task; 1000 do not,
and sentence order needs about 12000, REPRODUCTION.md), `task=` `source`
(default: which corpus a held-out sentence comes from,
bundled/labeled/corpus_source.tsv.gz, from documents pre-training never
sees; 6% of its rows train, 24% eval, 70% test: few labels, where
pre-training pays) or `spam` (the SpamAssassin e-mails, CC0, 80/10/10),
`finetune_steps=N` (default 150; 0 skips fine-tuning), `quick` (a 30-step
pre-training and 20-step fine-tuning smoke run).
"""

from albert_jax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, steps=2000, finetune_steps=150,
                              task="source", quick=False)
  if args.task not in TASKS:
    raise ValueError(f"configs/demo.py: unknown task={args.task!r}; use "
                     f"one of {', '.join(TASKS)}.")
  steps = 30 if args.quick else args.steps
  model = config_lib.model_config(
      vocab_size=5000, embedding_size=64, hidden_size=128,
      num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
      max_position_embeddings=128, hidden_act="gelu_new", share="all")
  c = config_lib.base_config(
      model, batch_size=34, num_train_steps=steps,
      warmup_steps=max(steps // 10, 1), learning_rate=5e-3,
      max_seq_length=128, max_predictions=20)
  c.data.dupe_factor = 2
  # Up to 3 instances a row, each with its own [CLS], positions and sentence
  # label: one a row, ALBERT's 10% short instances leave 6.9% of the
  # positions padding; packed, 0.4% (BENCHMARKS.md, packed pre-training).
  # Packed, batch_size counts instances: the demo's data packs 63,152 into
  # 59,061 rows (1.07 a row), so a step takes the 32 rows that hold 34 on
  # average, the 32 rows a step the README's run took.
  c.data.pack = 3
  # task=source's sentences come from the documents held out at exactly this
  # fraction (bundled/scripts/build_corpus_source.py): change it and the
  # pre-training may see some of them.
  c.data.eval_fraction = 0.02
  c.data.num_workers = 2
  c.log_every_steps = 10
  c.eval_every_steps = max(steps // 3, 1)
  c.eval_batches = 8
  c.checkpoint_every_steps = max(steps // 3, 1)
  c.keep_checkpoints = 2

  # Last stage: fine-tune the pre-trained model on the downstream task.
  if args.finetune_steps == 0:
    return c
  ft_steps = 20 if args.quick else args.finetune_steps
  c.finetune = config_lib.bundled_task_config(args.task, ft_steps)
  # Written for the demo, so in none of the bundled files.
  c.finetune.predict_texts = TASKS[args.task]
  # Then the same fine-tune from random weights: what pre-training bought.
  c.finetune.compare_random_init = True
  return c


NEW_SENTENCES = (  # in the manner of moby_dick, python_docs and sotu
    "The mate lowered the boat at dawn, and we pulled hard after the whale "
    "until the line ran smoking over the bow.",
    "If the key is not found, the method returns the default value instead "
    "of raising a KeyError.",
    "I ask the Congress to pass a budget that keeps faith with our farmers, "
    "our workers and our veterans.",
)

NEW_EMAILS = (
    "Congratulations!!! You have been selected to receive a FREE $1000 "
    "gift card. Click here now to claim your prize before it expires!",
    "Hi Tom, the meeting with the design team moved to Thursday at 3pm. "
    "Could you send me last week's slides before then? Thanks, Anna",
    "I tried your patch for the build script on my machine and the tests "
    "pass now. I will merge it tomorrow unless someone objects.",
)

# task (config_lib.BUNDLED_TASKS) → new texts to predict
TASKS = {"source": NEW_SENTENCES, "spam": NEW_EMAILS}
