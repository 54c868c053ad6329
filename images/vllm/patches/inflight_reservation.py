"""A small patch to vLLM's scheduler: remember the reservation of a request whose KV is being loaded.

What it fixes. Before admitting a request whose KV arrives asynchronously (a CPU-pool hit), vLLM's scheduler
sums the blocks every other in-flight prefill still needs (`Scheduler._inflight_prefill_reserved_blocks`, added
for vLLM issue #39734's deadlock). It recomputes each term through the KV-cache coordinator for every admitted
load, so admitting N loads costs N^2/2 coordinator calls: 320,000 for the 800 requests of one 100%-hit pass of
bench/gpu's throughput experiment, 14% of the engine core's samples in the H200 profile (bench/
api-servers). With the patch the coordinator is asked once per request; the walk over the in-flight set
stays (about 0.5 us per element against vLLM's 2.1 on the CPU: bench/scheduler-side/scheduler_reservation.py). Measured: 1.32x
prompt throughput at 100% CPU hit on the H200 (same call, 4 API servers).

Why remembering is exact. A request waiting for its load (status WAITING_FOR_REMOTE_KVS) keeps its allocated
blocks, its computed-token count and its token count until the load ends or fails; the term depends on nothing
else. A failed load resets the computed-token count (which the memo keys on) and ends the wait; a chunked prefill
that is running (the set's other members) is still recomputed every time. The sum is unchanged, only cheaper:
tests/images/test_vllm_patches.py checks it against the original on a real engine.

When it can go. When upstream keeps the reservation incrementally: `apply` refuses to touch a scheduler whose
function no longer reads as below (exit 1, one line), so the image build of a vLLM that changed it fails and
someone decides whether the patch is still needed.

Applied at image build time (images/vllm/Dockerfile) and by bench/gpu/serve_bench.py for an engine that asks
for it; never at run time. `python3 inflight_reservation.py apply|revert|check [SITE_PACKAGES]`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# The shared apply/revert/check machinery lives beside this file (the image copies the folder whole).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from source_patch import PatchError, SourcePatch, vllm_site

__all__ = ["MARKER", "NAME", "PatchError", "apply", "is_applied", "patch_source", "revert", "target", "vllm_site"]

NAME = "inflight_reservation"
TARGET = Path("vllm/v1/core/sched/scheduler.py")
MARKER = f"# Spillway patch: {NAME}"

# vLLM 0.26.0, 0.32.0 and 0.33.0 (their blank line after the docstring differs).
ORIGINAL = re.compile(
    r'(?P<indent>[ ]{4})def _inflight_prefill_reserved_blocks\(self\) -> int:\n'
    r'[ ]{8}"""Num blocks in-flight prefills still need to finish \(their reservation\)\."""\n'
    r'(?:\n)?'
    r'[ ]{8}return sum\(\n'
    r'[ ]{12}self\._request_remaining_blocks\(req\) for req in self\._inflight_prefills\n'
    r'[ ]{8}\)\n'
)

PATCHED = f'''    def _inflight_prefill_reserved_blocks(self) -> int:
        """Num blocks in-flight prefills still need to finish (their reservation)."""
        {MARKER} (images/vllm/patches/inflight_reservation.py).
        # A request waiting for its KV load keeps its blocks and token counts until the load ends, so its
        # term is remembered instead of recomputed for every request admitted after it (quadratic).
        memo = self.__dict__.setdefault("_spillway_reservation_memo", {{}})
        total = 0
        for req in self._inflight_prefills:
            if req.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
                total += self._request_remaining_blocks(req)
                continue
            key = (req.num_computed_tokens, req.num_tokens)
            seen = memo.get(req)
            if seen is None or seen[0] != key:
                seen = memo[req] = (key, self._request_remaining_blocks(req))
            total += seen[1]
        if len(memo) > 2 * len(self._inflight_prefills) + 64:
            for req in [r for r in memo if r not in self._inflight_prefills]:
                del memo[req]
        return total
'''


def _transform(source: str) -> str:
    found = ORIGINAL.findall(source)
    if len(found) != 1:
        raise PatchError(f"{TARGET}: _inflight_prefill_reserved_blocks does not read as vLLM 0.26-0.33's "
                         f"({len(found)} matches); this vLLM needs its own look before the patch is carried")
    return ORIGINAL.sub(lambda _m: PATCHED, source, count=1)


PATCH = SourcePatch(NAME, TARGET, _transform)
target, is_applied, patch_source, apply, revert = (PATCH.target, PATCH.is_applied, PATCH.patch_source,
                                                   PATCH.apply, PATCH.revert)


if __name__ == "__main__":
    sys.exit(PATCH.main(sys.argv[1:]))
