"""Whether a waiting request may load from the pool asynchronously (vLLM 0.34's `may_load_async`).

With `--max-num-inflight-kv-loads`, vLLM 0.34's scheduler lets the requests a connector names here start their
loads while the running batch or the token budget is full, so their KV is on the GPU when a slot frees; the
rest wait for a slot as before (vllm/v1/core/sched/scheduler.py, `_enqueue_waiting_request`, and the
`loads_only` branch of `schedule`). vLLM's OffloadingConnector keeps the base answer (only P/D remote
prefills), so without this no pool hit ever takes that path.

The answer must be cheap (vLLM asks it every time a request enters a waiting queue) and a false positive only
holds other async loads back until a slot frees, so it asks the pool for one chunk: the request's first
complete chunk of its first KV-cache group, keyed exactly as vLLM's lookup keys it (`RequestOffloadState.
update_offload_keys`: every `hashes_per_chunk`-th block hash, with the group's index). A request whose first chunk
is held almost always hits further; one whose first chunk is missing cannot hit at all in a full-attention group.
"""
from __future__ import annotations

from typing import Any

from spillway_connector.compat import HELD_LOOKUPS, make_offload_key


def first_chunk_held(scheduler: Any, request: Any) -> bool:
    """True when the pool holds (or is storing) the request's first chunk; False when it cannot tell cheaply."""
    state = scheduler._req_status.get(request.request_id)
    if state is None or getattr(state, "load_failed", False) or getattr(request, "skip_reading_external_kv", False):
        return False  # vLLM skips the pool for these (get_num_new_matched_tokens): nothing would load
    group = scheduler.config.kv_group_configs[0]
    hashes = request.block_hashes
    if len(hashes) < group.hashes_per_chunk:
        return False
    key = make_offload_key(hashes[group.hashes_per_chunk - 1], group.group_idx)
    return scheduler.manager.lookup(key, state.req_context) in HELD_LOOKUPS
