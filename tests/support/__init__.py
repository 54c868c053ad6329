"""Shared test support: a real vLLM server on the CPU (see vllm_server.py)."""
from .vllm_server import (
    SERVED_MODEL_NAME,
    ServerStartError,
    TinyLlama,
    VllmServer,
    require_vllm,
    vllm_available,
    vllm_server_fixture,
    write_tiny_model,
)

__all__ = [
    "SERVED_MODEL_NAME",
    "ServerStartError",
    "TinyLlama",
    "VllmServer",
    "require_vllm",
    "vllm_available",
    "vllm_server_fixture",
    "write_tiny_model",
]
