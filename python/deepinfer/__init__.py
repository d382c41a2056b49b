"""deepinfer: offline inference for DeepSeek-V4 (C++/CUDA engine with a vLLM-shaped Python API)."""
from . import _C  # noqa: F401  (built by ./build.sh)
from .llm import LLM
from .outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from .sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
from .tokenizer import DecodeStream, Tokenizer

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "RequestOutputKind", "RequestOutput",
           "CompletionOutput", "Logprob", "RequestMetrics", "Tokenizer", "DecodeStream"]
