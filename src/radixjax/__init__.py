"""radixjax: a JAX-native LLM serving engine with a radix-tree KV cache."""

__version__ = "0.1.0"
