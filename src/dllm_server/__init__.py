"""dllm-server: serving for diffusion LLMs (LLaDA, Dream)."""
from .decoding.params import SamplingParams, StructuredOutputs

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "StructuredOutputs", "__version__"]


def __getattr__(name):
    if name == "LLM":   # lazy: importing the package must not load torch models
        from .llm import LLM
        return LLM
    raise AttributeError(name)
