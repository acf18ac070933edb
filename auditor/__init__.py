"""GPU Balance Auditor: which rank holds a multi-GPU PyTorch job back, why, and what to change."""

__version__ = "0.1.0"
