"""deepinfer: offline inference for DeepSeek-V4 (C++/CUDA engine with a vLLM-shaped Python API)."""
from . import _C  # noqa: F401  (built by ./build.sh)

__version__ = "0.1.0"
