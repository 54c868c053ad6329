"""A replica that joins or restarts, warm from its first request where a ModelServer's replicas share a disk tier:
three real vLLM CPU replicas (routing/replicas.py) over one node-disk directory, as one ModelServer's pods share
a volume (one model path, one share: each writes a slot of its own and reads the others', disk_namespace.py),
behind one `spillway route`; traffic from routing/fleet_load.py, as in test_fleet_engines.py.

- a replica that joins serves the prefixes its ring arcs take over from the chunks the others wrote: it reads
  them from their slots, and its own hit share is at least 90% of the others' over the requests after the join
  (on its pool alone, 0.62-0.74 against 0.84-0.86: bench/fleet/README.md);
- a replica restarted between requests serves its prefixes from the tier (its own slot, which the restart takes
  again, and the others' for the prefixes they computed while it was down): over the second half of the phase
  after its Ready its own hit share is at least 90% of the steady share of the replicas that kept their pools
  (issue 39's goal; on its pool alone it stayed under in 2 restarts of 4, with the tier it was the best possible
  in every slice of 6).

What is not asserted here: the restarted replica's share of the requests. Its first requests wait for their
chunks to come from disk (vLLM's queue time, 130-400 ms here against 15-20 ms on the pools alone), so the load
bound passes more of its prefixes on than on the pools alone (shares 0.18-0.48 against arcs of 0.23-0.52);
test_fleet_engines.py asserts the share on the pools alone.
"""
from __future__ import annotations

import asyncio

import pytest
from routing import fleet_load as F
from routing.replicas import start_replicas

pytestmark = pytest.mark.engine

CONCURRENCY = 4
LEAST_RING_SHARE = 0.2


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    with start_replicas(disk_root=tmp_path_factory.mktemp("node-disk")) as servers:
        yield servers


def _workload(replicas, name: str) -> F.Workload:
    return F.Workload(name, seed=F.balanced_seed(name, [s.base_url for s in replicas], LEAST_RING_SHARE))


def test_a_joining_replica_serves_what_the_others_computed(replicas, capsys):
    r = asyncio.run(F.scale_up(replicas, 1, _workload(replicas, "warm-scale"), requests=240,
                               concurrency=CONCURRENCY))
    with capsys.disabled():
        print(f"\nscale_up: {r}")
    assert r["first_half_errors"] == 0 and r["client_errors"] == 0, r["error_samples"]
    assert r["sibling_chunks"][-1] > 0, r  # the chunks of the prefixes it took over came from the others' slots
    joined, others = r["replica_hit_shares"][-1], [h for h in r["replica_hit_shares"][:-1] if h is not None]
    assert joined is not None and joined >= F.WARM_FRACTION * max(others), r


def test_a_restarted_replica_is_warm_from_the_shared_tier(replicas, capsys):
    r = asyncio.run(F.restart(replicas, 1, _workload(replicas, "warm-restart"), restarted=0, before_requests=40,
                              down_requests=30, after_requests=120, concurrency=CONCURRENCY))
    with capsys.disabled():
        print(f"\nrestart: {r}")
    for phase in (r["before"], r["down"], r["after"]):
        assert phase["client_errors"] == 0, phase["error_samples"]
    warm = r["warm"]
    assert sum(s["disk_hit_chunks"] for s in warm["slices"]) > 0, warm  # its prefixes came back from the tier
    assert warm["second_half_hit_share"] is not None, warm  # it served requests in the second half
    assert warm["second_half_hit_share"] >= F.WARM_FRACTION * warm["steady_hit_share"], warm
