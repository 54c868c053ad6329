"""controller.conditions: the ModelServer's Planned/Ready/Degraded conditions from the plan and the Deployment."""
from __future__ import annotations

from spillway.controller import conditions as cond

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def deployment(wanted: int = 2, ready: int = 0, **status) -> dict:
    return {"spec": {"replicas": wanted}, "status": {"readyReplicas": ready, **status}}


def test_transition_time_moves_only_when_the_status_changes():
    first = cond.merge(None, [cond.condition(cond.READY, False, "ReplicasNotReady", "0 of 2", 1)], T0)
    same = cond.merge(first, [cond.condition(cond.READY, False, "ReplicasNotReady", "1 of 2", 2)], T1)
    flipped = cond.merge(same, [cond.condition(cond.READY, True, "ReplicasReady", "2 of 2", 2)], T1)
    assert same[0]["lastTransitionTime"] == T0 and same[0]["message"] == "1 of 2"
    assert same[0]["observedGeneration"] == 2
    assert flipped[0]["lastTransitionTime"] == T1 and flipped[0]["status"] == "True"


def test_conditions_keep_a_fixed_order_and_foreign_ones():
    merged = cond.merge([{"type": "Zeta", "status": "True"}, {"type": cond.DEGRADED, "status": "False"}], [
        cond.condition(cond.READY, True, "ReplicasReady", "", None),
        cond.condition(cond.PLANNED, True, cond.REASON_PLANNED, "", None)], T0)
    assert [c["type"] for c in merged] == [cond.PLANNED, cond.READY, cond.DEGRADED, "Zeta"]
    assert cond.find(merged, "Zeta") == {"type": "Zeta", "status": "True"} and cond.find(merged, "Nope") is None
    assert cond.find([None, "junk", {"type": cond.READY}], cond.READY) == {"type": cond.READY}


def test_ready_follows_the_deployments_ready_replicas():
    assert cond.ready_condition(None, 1)["reason"] == cond.REASON_NOT_DEPLOYED
    assert cond.ready_condition(deployment(wanted=0), 1)["reason"] == cond.REASON_SCALED_TO_ZERO
    partly = cond.ready_condition(deployment(2, 1), 1)
    assert (partly["status"], partly["reason"], partly["message"]) == ("False", "ReplicasNotReady", "1 of 2 replicas ready")
    assert cond.ready_condition(deployment(2, 2), 1)["status"] == "True"


def test_degraded_names_a_failed_plan_or_a_stuck_rollout():
    failed = cond.condition(cond.PLANNED, False, "PoolDoesNotFit", "4Ti does not fit", 3)
    nothing = cond.degraded_condition(failed, None, 3)
    assert (nothing["status"], nothing["reason"]) == ("True", "PoolDoesNotFit")
    assert nothing["message"] == "4Ti does not fit (nothing is deployed)"
    assert "the last applied plan keeps running" in cond.degraded_condition(failed, deployment(), 3)["message"]
    planned = cond.condition(cond.PLANNED, True, cond.REASON_PLANNED, "ok", 3)
    stuck = deployment(conditions=[
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "timed out"}])
    rollout = cond.degraded_condition(planned, stuck, 3)
    assert (rollout["reason"], rollout["message"]) == (cond.REASON_ROLLOUT_FAILED, "Deployment Progressing: timed out")
    healthy = cond.degraded_condition(planned, deployment(2, 2), 3)
    assert (healthy["status"], healthy["reason"]) == ("False", cond.REASON_AS_EXPECTED)


def test_ready_counts_feed_the_scale_subresource():
    assert cond.ready_counts(None) == {"replicas": 0, "readyReplicas": 0, "ready": "0/0"}
    assert cond.ready_counts(deployment(3, 1, replicas=3)) == {"replicas": 3, "readyReplicas": 1, "ready": "1/3"}
