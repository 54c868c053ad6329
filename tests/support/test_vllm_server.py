"""The shared harness itself: a real server answers token-id prompts, reports its KV size, and dies whole."""
from __future__ import annotations

import json
import urllib.request

import pytest
from spillway.core import vllm_api as V

from support import VllmServer, vllm_server_fixture
from support.vllm_server import _group_alive, _is_live_member, _pids

pytestmark = pytest.mark.engine

server = vllm_server_fixture(num_gpu_blocks=24, max_model_len=1024, max_num_seqs=4)


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


def test_completion_from_token_ids(server: VllmServer):
    prompt = server.token_ids(40, seed=1)
    reply = post_json(server.url(V.COMPLETIONS_PATH), {"model": server.model, "prompt": prompt, "max_tokens": 2})
    assert reply["usage"]["prompt_tokens"] == 40
    assert reply["usage"]["completion_tokens"] == 2


def test_kv_cache_is_the_requested_size(server: VllmServer):
    info = [line for line in server.metrics_text().splitlines() if line.startswith(V.Metric.CACHE_CONFIG_INFO + "{")]
    assert info, "no cache_config_info in /metrics"
    assert 'num_gpu_blocks="24"' in info[0]


def test_stop_kills_the_whole_process_group(server: VllmServer):
    """Runs last in this module: the engine core and its workers live in the server's group."""
    pgid = server.pid
    members = [pid for pid in _pids() if _is_live_member(pid, pgid)]
    assert len(members) >= 2, f"expected the API server and its engine core, found {members}"
    server.stop()
    assert not _group_alive(pgid)
    assert not server.running
