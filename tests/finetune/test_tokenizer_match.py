"""A configured tokenizer must be the checkpoint's (finetune/starting_point.py)."""

import pytest

from albert_jax import ModelConfig
from albert_jax import config_lib
from albert_jax.finetune import starting_point
from albert_jax.text.tokenizer import Tokenizer
from locations import TESTDATA


class Pieces:
  """A tokenizer as check_tokenizer sees it: its size and its pieces."""

  def __init__(self, pieces):
    self.pieces = list(pieces)
    self.vocab_size = len(self.pieces)

  def id_to_piece(self, i):
    return self.pieces[i]


MODEL = ModelConfig(**{**config_lib.TINY, "vocab_size": 300})


def test_more_pieces_than_the_embedding_is_refused(tiny_spm):
  big = Tokenizer.from_file(str(TESTDATA / "t5_c4_32k.model"))
  with pytest.raises(ValueError) as e:
    starting_point.check_tokenizer(big, None, MODEL, "t5.model", "/ckpt")
  assert str(e.value) == (
      f"config.data.tokenizer t5.model has {big.vocab_size} pieces but the "
      "model embeds 300 ids ([0, 299]), so its ids from 300 on would be "
      "misread (the checkpoint /ckpt); use the tokenizer it was pre-trained "
      "with (leave config.data.tokenizer empty where the checkpoint has "
      "one).")


def test_same_size_other_pieces_is_refused_and_the_same_passes(tiny_spm):
  own = Tokenizer.from_file(tiny_spm)
  starting_point.check_tokenizer(Tokenizer.from_file(tiny_spm), own, MODEL, tiny_spm,
                      "/ckpt")
  other = Pieces(own.id_to_piece(i) for i in range(own.vocab_size))
  other.pieces[17] = "▁elsewhere"
  with pytest.raises(ValueError) as e:
    starting_point.check_tokenizer(other, own, MODEL, "other.model", "/ckpt")
  assert str(e.value) == (
      "config.data.tokenizer other.model is not the tokenizer /ckpt was "
      f"pre-trained with (id 17 is '▁elsewhere' there and "
      f"{own.id_to_piece(17)!r} in the checkpoint's); leave "
      "config.data.tokenizer empty to use the checkpoint's own.")
