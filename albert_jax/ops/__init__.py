"""Hot-path operations with a reference implementation beside each kernel."""

from albert_jax.ops.attention import IMPLEMENTATIONS
from albert_jax.ops.attention import dot_product_attention

__all__ = ["IMPLEMENTATIONS", "dot_product_attention"]
