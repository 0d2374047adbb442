"""radixjax: a JAX-native LLM serving engine with a radix-tree KV cache."""

from radixjax.engine.config import EngineConfig
from radixjax.engine.engine import Engine, GenerateOutput, StreamChunk, generate
from radixjax.sampling.params import SamplingParams

__version__ = "0.1.0"
__all__ = ["Engine", "EngineConfig", "GenerateOutput", "SamplingParams", "StreamChunk",
           "generate"]
