"""experiments/colab_quickstart.ipynb runs top to bottom on a tiny checkpoint.

The notebook is executed in a fresh python3 kernel with CHECKPOINT pointing
at a tiny random ALBERT (transformers' AlbertForPreTraining with a trained
SentencePiece vocabulary); its printed fill-in, fine-tuning and prediction
results are checked against transformers, the run's own metrics file and
the fine-tuned model reloaded here.
"""

import ast
import json
import re

from locations import EXPERIMENTS
import numpy as np
import pytest

import albert_jax
from albert_jax.text.tokenizer import Tokenizer

# Whole runs: the long tier (tests/conftest.py).
pytestmark = pytest.mark.long

nbclient = pytest.importorskip(
    "nbclient", reason="nbclient is not installed; install nbclient, nbformat "
    "and ipykernel (the test extra) to execute the Colab notebook")
nbformat = pytest.importorskip("nbformat")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

NOTEBOOK = EXPERIMENTS / "colab_quickstart.ipynb"
HIDDEN = 32
CELL_TIMEOUT_S = 300  # One core shared with other work; the whole run ~30 s.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_tokenizer):
  """(HF AlbertForPreTraining, its directory with spiece.model)."""
  tok = tiny_tokenizer
  config = transformers.AlbertConfig(
      vocab_size=tok.vocab_size, embedding_size=16, hidden_size=HIDDEN,
      num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
      max_position_embeddings=64)
  torch.manual_seed(0)
  model = transformers.AlbertForPreTraining(config)
  with torch.no_grad():  # Spread the MLM's guesses so the best is clear.
    for p in model.parameters():
      p.add_(torch.randn_like(p))
  path = tmp_path_factory.mktemp("checkpoint")
  model.eval().save_pretrained(path)
  tok.save(str(path))
  return model, str(path)


def stdout_of(cell) -> str:
  return "".join(o.get("text", "") for o in cell.outputs
                 if o.output_type == "stream" and o.name == "stdout")


def tagged(nb, tag):
  (cell,) = [c for c in nb.cells if tag in c.metadata.get("tags", [])]
  return cell


def expected_fill(model, path, text) -> str:
  """transformers' best token at each [MASK], decoded by albert_jax."""
  hf_tok = transformers.AlbertTokenizer.from_pretrained(path)
  ids = np.asarray(hf_tok(text)["input_ids"])
  masks = ids == hf_tok.mask_token_id
  with torch.no_grad():
    logits = model(torch.as_tensor(ids[None])).prediction_logits[0]
  top2 = torch.topk(logits[torch.as_tensor(masks)], 2).values
  assert ((top2[:, 0] - top2[:, 1]) > 1e-3).all()  # no near-tie to flip
  ids[masks] = logits.argmax(-1).numpy()[masks]
  return Tokenizer.find_in(path).decode(ids[1:-1])


def test_notebook_runs_on_a_tiny_checkpoint(checkpoint, tmp_path,
                                            monkeypatch):
  model, path = checkpoint
  monkeypatch.setenv("CHECKPOINT", path)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  with open(NOTEBOOK, encoding="utf-8") as f:
    nb = nbformat.read(f, as_version=4)
  nbformat.validate(nb)
  # Raises CellExecutionError, naming the cell, if any cell fails.
  nbclient.NotebookClient(
      nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
      resources={"metadata": {"path": str(tmp_path)}}).execute()
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert all(c.execution_count for c in code)
  assert not any(o.output_type == "error" for c in code for o in c.outputs)
  assert f"albert_jax from {albert_jax.__file__}" in stdout_of(code[0])

  # Fill-mask: every text is printed with transformers' best tokens filled in.
  printed = stdout_of(tagged(nb, "fill_mask"))
  texts = re.findall(r"^text:   (.*)$", printed, re.M)
  filled = re.findall(r"^filled: (.*)$", printed, re.M)
  assert len(texts) == len(filled) == 2
  assert sum(t.count("[MASK]") for t in texts) == 3
  assert len(re.findall(r"^  token \d+: ", printed, re.M)) == 3
  for text, got in zip(texts, filled):
    assert got == expected_fill(model, path, text), text

  similarity = stdout_of(tagged(nb, "similarity"))
  assert f"pooled_output: (9, {HIDDEN})" in similarity
  assert len(re.findall(r"mean-pooled cosine -?[01]\.\d{3}, \[CLS\]-pooled "
                        r"-?[01]\.\d{3}", similarity)) == 3

  # Fine-tuning: the printed accuracy is the run's own final metric.
  workdir = tmp_path / "albert_jax_quickstart" / "classifier"
  with open(workdir / "final_metrics.json", encoding="utf-8") as f:
    metrics = json.load(f)
  assert metrics["task"] == "files" and metrics["step"] == 20
  (accuracy,) = re.findall(r"^eval accuracy: (\d\.\d{3}) after 20 steps",
                           stdout_of(tagged(nb, "finetune")), re.M)
  assert accuracy == f"{metrics['eval_accuracy']:.3f}"
  check_predictions(tagged(nb, "predict"), workdir, metrics["best_step"])
  predictions = stdout_of(code[-1]).strip().splitlines()
  assert len(predictions) == 1 + 4  # header and the 4 evaluation rows


def literal(cell, name: str):
  """The value a cell assigns to `name` as a literal."""
  (value,) = [node.value for node in ast.parse(cell.source).body
              if isinstance(node, ast.Assign)
              and [getattr(t, "id", None) for t in node.targets] == [name]]
  return ast.literal_eval(value)


PROBABILITIES = "  probabilities: "


def check_predictions(cell, workdir, best_step: int) -> None:
  """The "predict" cell's output: the reloaded classifier's task, labels
  and step, then per new text (in order) "LABEL (P): TEXT" and its
  probabilities by label, equal to this process's predictions."""
  texts = literal(cell, "NEW_TEXTS")
  with open(workdir / "task.json", encoding="utf-8") as f:
    labels = tuple(json.load(f)["labels"])
  assert sorted(labels) == ["negative", "positive"]
  lines = stdout_of(cell).splitlines()
  assert lines[0] == (f"classification on labels {labels}, step "
                      f"{best_step}")
  assert len(lines) == 1 + 2 * len(texts)
  want = albert_jax.load_pretrained(str(workdir), step="best").predict(texts)
  for text, line, probs_line, w in zip(texts, lines[1::2], lines[2::2], want):
    label, probability, printed = re.fullmatch(
        r"(\S+) \((\d\.\d{3})\): (.*)", line).groups()
    assert printed == text
    assert label in labels
    assert probs_line.startswith(PROBABILITIES), probs_line
    probs = json.loads(probs_line[len(PROBABILITIES):])
    assert tuple(probs) == labels
    assert abs(sum(probs.values()) - 1) < 1e-5
    assert label == max(probs, key=probs.get)
    assert probability == f"{probs[label]:.3f}"
    assert label == w["label"]
    np.testing.assert_allclose(list(probs.values()),
                               list(w["probabilities"].values()), rtol=0,
                               atol=1e-5)
