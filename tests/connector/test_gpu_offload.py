"""The same workload on a CUDA GPU with vLLM's native CPU offloading (DMA to pinned host memory).

Runs where vLLM has a CUDA build and a GPU (the lent H200 runs vLLM 0.26); skips elsewhere. The model
is larger than the CPU test's so transfers are DMA-sized: 8 layers x 8 KV heads x 128 dims, 32 KiB of
KV per token, 512 KiB per 16-token block.
"""
from __future__ import annotations

import json

import pytest
from spillway.core import vllm_api as V
from spillway_connector import names
from support import TinyLlama, vllm_server_fixture
from support.offload_workload import OffloadChecks, Workload
from support.promtext import total

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

pytestmark = [pytest.mark.engine, pytest.mark.gpu]

MODEL = TinyLlama(num_hidden_layers=8, hidden_size=1024, intermediate_size=2048, num_attention_heads=8,
                  num_key_value_heads=8, vocab_size=4096)
WORKLOAD = Workload(block_tokens=16, engine_blocks=24, prompt_blocks=6, output_blocks=8, model=MODEL)


def gpu_offload_args(cpu_bytes: int) -> list[str]:
    config = {
        V.KV_CONNECTOR_KEY: V.SPILLWAY_CONNECTOR,
        V.KV_CONNECTOR_MODULE_PATH_KEY: V.SPILLWAY_CONNECTOR_MODULE,
        V.KV_ROLE_KEY: V.KV_ROLE_BOTH,
        V.KV_CONNECTOR_EXTRA_CONFIG_KEY: {V.EXTRA_CPU_BYTES: cpu_bytes, V.EXTRA_EVICTION_POLICY: "lru"},
    }
    return [V.FLAG_KV_TRANSFER_CONFIG, json.dumps(config)]


server = vllm_server_fixture(
    **WORKLOAD.server_kwargs(),
    extra_args=gpu_offload_args(WORKLOAD.pool_bytes),
    env={V.ENV_USE_V2_MODEL_RUNNER: "0"},  # vLLM 0.26 offloads cross-layer blocks with the V1 runner only
)


class TestNativeOffloadingOnGpu(OffloadChecks):
    workload = WORKLOAD

    def test_transfers_run_at_dma_speed(self, run):
        text = run["final"]
        for direction in names.DIRECTIONS:
            labels = {names.LABEL_DIRECTION: direction}
            count = total(text, names.TRANSFER_THROUGHPUT + "_count", **labels)
            mean_gbps = total(text, names.TRANSFER_THROUGHPUT + "_sum", **labels) / count
            print(f"{direction}: {count:.0f} transfers, mean {mean_gbps:.1f} GB/s")
            assert mean_gbps > 1.0, direction  # DMA of 512 KiB pages: tens of GB/s; below 1, the timing is off
