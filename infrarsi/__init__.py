"""InfraRSI: make an existing PyTorch LLM training job faster without changing what it computes."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
