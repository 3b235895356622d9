"""hints.py: the one "did you mean" every message uses."""

from albert_jax import hints


def test_closest_ignores_case_and_keeps_the_choices_spelling():
  assert hints.closest("ADAMW", ["lamb", "AdamW"]) == ["AdamW"]
  assert hints.closest("regresion", ("classification", "regression")) == [
      "regression"]
  assert hints.closest("zzz", ["lamb", "adamw"]) == []


def test_closest_gives_up_to_n_best_first_and_takes_a_cutoff():
  choices = ["num_train_steps", "log_every_steps", "eval_every_steps",
             "checkpoint_every_steps", "batch_size"]
  assert hints.closest("eval_every_step", choices, n=2) == [
      "eval_every_steps", "log_every_steps"]
  assert hints.closest("steps", choices) == []
  assert hints.closest("steps", choices, cutoff=0.3) == ["num_train_steps"]


def test_suggestion_reads_as_a_sentence():
  assert hints.suggestion([]) == ""
  assert hints.suggestion(["sop"]) == " (did you mean 'sop'?)"
  assert hints.suggestion(["a", "b"]) == " (did you mean 'a' or 'b'?)"
  assert hints.suggestion(["a", "b", "c"]) == (
      " (did you mean 'a', 'b' or 'c'?)")


def test_did_you_mean():
  assert hints.did_you_mean("glue/sst", ["glue/sst2", "files"]) == (
      " (did you mean 'glue/sst2'?)")
  assert hints.did_you_mean(3, [1, 2]) == ""  # not strings: compared as text
  assert hints.did_you_mean("x", []) == ""
