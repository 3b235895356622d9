"""Hot-path operations with a reference implementation beside each kernel."""

from albert_jax.ops.attention import dot_product_attention
from albert_jax.ops.attention import IMPLEMENTATIONS

__all__ = ["IMPLEMENTATIONS", "dot_product_attention"]
