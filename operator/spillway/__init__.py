"""Spillway: vLLM KV-cache offloading to CPU DRAM, sized and observed on Kubernetes."""
__version__ = "0.1.0"
