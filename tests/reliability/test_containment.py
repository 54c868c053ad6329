"""A ModelServer whose affinity the schema lets through unchecked (preserve-unknown-fields before the
schema described it; objects written before a schema change) must not stop the Node watcher from
re-planning the other tenants, and must itself end with a status."""
from __future__ import annotations

import pytest
from harness import Api, eventually, memory_limit

BROKEN_AFFINITIES = {
    "terms-a-string": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": "all"}}},
    "expressions-a-string": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": "gpu=true"}]}}},
}


@pytest.mark.parametrize("case", BROKEN_AFFINITIES)
def test_a_broken_affinity_gets_a_status_and_blocks_no_other_tenant(cluster, operator, case):
    bad, good = Api(cluster), Api(cluster)
    bad.node("a")
    # The broken one first: the Node watcher meets it before the healthy tenant.
    bad.modelserver("broken", affinity=BROKEN_AFFINITIES[case])
    good.node("big", "2Ti")
    good.modelserver()
    good.planned(status="True")
    before = memory_limit(eventually(good.deployment))
    planned = bad.planned("broken", status="False")
    assert planned["reason"] == "InvalidSpec" and "spec.affinity" in planned["message"], planned
    assert ("Warning", "InvalidSpec") in {(t, r) for t, r, _ in eventually(bad.events)}
    good.node("small", "512Gi")
    eventually(lambda: memory_limit(good.deployment()) != before, what="the healthy tenant re-planned")
    assert bad.deployments() == []
    assert operator.alive()
    assert "Traceback" not in operator.output(), operator.output()[-4000:]
