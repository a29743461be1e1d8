"""Triton kernels behind the shims, each with a plain-torch reference that is also the CPU path."""
