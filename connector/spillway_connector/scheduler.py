"""vLLM's scheduler with the reservation of a request whose KV is being loaded remembered, not recomputed.

Load it with `--scheduler-cls spillway_connector.scheduler.SpillwayScheduler` (the planner writes it for the
releases that need it, spillway.core.vllm_api.SCHEDULER_CLS_RELEASES). One name serves both of vLLM's schedulers:
where vLLM resolved async scheduling on, the instance is a SpillwayAsyncScheduler (AsyncScheduler's code with the
same method), so naming a custom class does not turn async scheduling off.

What it fixes. Before admitting a request whose KV arrives asynchronously (a CPU-pool hit), vLLM 0.26-0.33's
scheduler sums the blocks every other in-flight prefill still needs (`Scheduler._inflight_prefill_reserved_blocks`,
added for vLLM issue #39734's deadlock), recomputing each term through the KV-cache coordinator for every
admitted load: N loads cost N^2/2 coordinator calls, 14% of the engine core's samples at 100% CPU hit on the H200
(bench/api-servers), where remembering them gave 1.32x prompt throughput. vLLM 0.34 caches the
reservation of a parked load itself (`_reserve_parked`), so this class is not needed there and turns itself off.

Why remembering is exact. A request waiting for its load (status WAITING_FOR_REMOTE_KVS) keeps its allocated
blocks, its computed-token count and its token count until the load ends or fails; the term depends on nothing
else. A failed load resets the computed-token count (which the memo keys on) and ends the wait; a running chunked
prefill (the set's other members) is recomputed every time. tests/connector/test_scheduler_reservation.py checks
the sums against vLLM's on a real engine.

Guarded: only where vLLM's `_inflight_prefill_reserved_blocks` and `_request_remaining_blocks` read as in the
releases verified (source_guard.py; PATCHES.md); elsewhere both classes are vLLM's own schedulers, unchanged.
"""
from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from spillway_connector.source_guard import verified

# vLLM 0.26.0, 0.32.0 and 0.33.0 (vllm/v1/core/sched/scheduler.py); 0.34.0 reads otherwise (it caches itself).
RESERVATION_CODE = {
    "Scheduler._inflight_prefill_reserved_blocks": frozenset({"244f76229f63949a"}),
    "Scheduler._request_remaining_blocks": frozenset({"d8bf7b2c371d755e", "58b2b26e862d2a9b"}),
}


def reservation_functions() -> dict[str, Any]:
    return {name: vars(Scheduler).get(name.split(".")[1]) for name in RESERVATION_CODE}


MEMO_ON: bool = verified("the in-flight reservation memo (scheduler.py)", reservation_functions(), RESERVATION_CODE)


class _ReservationMemo:
    """The memoised `_inflight_prefill_reserved_blocks`, mixed in before vLLM's scheduler class."""

    if MEMO_ON:

        def _inflight_prefill_reserved_blocks(self) -> int:
            memo = self.__dict__.setdefault("_spillway_reservation_memo", {})
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


class SpillwayScheduler(_ReservationMemo, Scheduler):
    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        asynchronous = bool(getattr(getattr(vllm_config, "scheduler_config", None), "async_scheduling", False))
        return super().__new__(SpillwayAsyncScheduler if cls is SpillwayScheduler and asynchronous else cls)


class SpillwayAsyncScheduler(SpillwayScheduler, AsyncScheduler):
    pass
