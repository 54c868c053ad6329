"""The ModelServer operator: kopf handlers around manifests.desired().

Run: `kopf run --standalone --all-namespaces -m spillway.controller.handlers`.

- ModelServer created/changed/resumed -> read facts (GPU nodes from an in-memory index, the
  model's geometry), plan with the pure core, apply Deployment/Service/PodMonitor, write status.
- A GPU node added/removed/resized -> the ModelServers whose eligible nodes changed are re-planned
  (the Node watcher stamps them with the new fingerprint; kopf sees the change and reconciles).
- A Deployment's status changes -> the ModelServer's Ready condition follows.
- Bad input (a SpillwayError) -> conditions + a Warning event; nothing new is deployed and the
  handler returns normally, so the operator never crash-loops and never retries the same mistake.

Importing this module reads nothing and starts nothing: the startup handler reads the settings (a bad one
stops the operator with one line naming it), builds the API client and the re-plan worker, and keeps them in
kopf's operator memo (OperatorState), which every handler's `memo` shares.
"""
from __future__ import annotations

import base64
import contextvars
import functools
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
import urllib3

from ..adapters.hub import fetch_config
from ..adapters.kube import ApiError, Kube, load_config, path
from ..adapters.model_config import HubFetcher
from ..core import k8s_names as names
from ..core.claims import ClaimNotFound
from ..core.errors import (
    InternalError,
    InvalidSpec,
    ModelGeometryUnknown,
    NameConflict,
    PoolDoesNotFit,
    SpillwayError,
)
from ..core.routing import MODE_LLM_D, MODE_NONE
from . import autoscaling as scaling
from . import conditions as cond
from . import drift, metrics
from .autoscaling import AUTOSCALER_KINDS
from .claims import check_compile_cache_claim
from .disk_volume import check_disk_volume
from .facts import NodeSummary, eligibility, summarize_node
from .manifests import Desired, check_name, desired_for, selector
from .replan import LanedKube, Replanner
from .routing_objects import host_tier_credit, router_name, routing_object_keys
from .routing_status import REASON_NOT_ROUTED, REASON_PRUNE_FORBIDDEN, ROUTED, routing_status
from .settings import OperatorSettings
from .spec import ModelServerSpec, parse_spec
from .status import error_line, status_plan

GROUP, VERSION, PLURAL = names.GROUP, names.VERSION, names.PLURAL
# A referenced ConfigMap may appear later; API errors are retried too.
# API answers that refuse the object itself (invalid, malformed): retrying cannot help.
API_REFUSALS = (400, 422)
STATUS_RETRY_SECONDS = (0.5, 1.0, 2.0)  # then the error goes to kopf (a reconcile is retried, an event is not)
# The connection's own failures (a read timeout of a slow API server, a reset): passing trouble, retried like an
# API server's 5xx, never a ModelServer's InternalError.
TRANSPORT_ERRORS = (OSError, urllib3.exceptions.HTTPError)
OWNER_CHECK_SECONDS = 1.0  # a reconcile's writes look again, at most this often, that their ModelServer still exists

MEMO_KEY = "spillway"  # the OperatorState's key in kopf's operator memo

_replan_log = logging.getLogger("spillway.replan")  # kopf.objects drops records without its own extras
_resync_log = logging.getLogger("spillway.resync")


class OperatorState:
    """What the operator keeps for its whole run, built once by the startup handler. kopf gives each resource
    a shallow copy of the operator memo, so every handler's `memo` holds this same object."""

    def __init__(self, settings: OperatorSettings):
        self.settings = settings
        self.replanner = Replanner(functools.partial(_replan_now, self), _replan_log)
        self.kube: Kube = LanedKube(self.replanner.lane)  # node-driven re-plans' requests go first (replan.py)
        self.kube.timeout = settings.api_timeout_seconds
        # The owned fields of each vLLM Deployment as last applied (drift.py): a Deployment event that differs
        # is a hand edit.
        self.applied_owned: dict[tuple[str, str], dict[str, Any]] = {}
        # The eligible nodes' fingerprint each ModelServer was last planned for (status.nodesFingerprint as written).
        self.fingerprints: dict[tuple[str, str], str] = {}
        # What the resync reconciles: every ModelServer the index has seen (until its deletion), on the latest
        # GPU nodes.
        self.known: set[tuple[str, str]] = set()
        self.node_index: list[kopf.Index] = []  # the live GPU node index, once a node event has handed it over
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def lock(self, namespace: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        """A deleted ModelServer leaves nothing behind."""
        key = (namespace, name)
        self.applied_owned.pop(key, None)
        self.fingerprints.pop(key, None)
        self.known.discard(key)
        with self._locks_guard:
            self._locks.pop(key, None)


def _state(memo: kopf.Memo) -> OperatorState:
    return memo[MEMO_KEY]


def _ms_path(namespace: str, name: str, subresource: str | None = None) -> str:
    return path(names.API_VERSION, PLURAL, namespace, name, subresource)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    try:
        ours = OperatorSettings.from_environ(os.environ)
    except SpillwayError as exc:
        # Retrying cannot mend the pod's environment. SystemExit passes by kopf's handler machinery (it catches
        # Exception), so the operator ends with this one line and status 1, not with retries and tracebacks.
        logger.error(f"the operator does not start: {exc}")
        raise SystemExit(1) from None
    # kopf's bookkeeping in annotations under its own prefix (a status field would be pruned by the schema).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.KOPF_ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=names.KOPF_ANNOTATION_PREFIX)
    settings.persistence.finalizer = names.FINALIZER
    # Post our own events (and warnings), not one per handler run.
    settings.posting.level = logging.WARNING
    # Serve the namespaces named on the command line and the resources found at startup: the chart grants no
    # access to Namespaces or CRDs, which kopf would otherwise retry for a minute before falling back.
    settings.scanning.disabled = True
    load_config()
    memo[MEMO_KEY] = OperatorState(ours)
    if ours.metrics_port is not None:
        metrics.serve(ours.metrics_port)


# -- facts kept in memory --------------------------------------------------------------------------------

# The indexes are async on purpose: kopf runs a sync handler in its thread pool, where a burst of reconciles
# holds every thread, so a node's new facts (and the re-plan they trigger) would wait behind all of them.
@kopf.index("", "v1", "nodes")
async def gpu_nodes(name: str, body: kopf.Body, **_: Any) -> dict[str, NodeSummary] | None:
    summary = summarize_node(body)
    return {name: summary} if summary is not None else None


@kopf.index(GROUP, VERSION, PLURAL)
async def modelservers(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo,
                       **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    if not (body.get("metadata") or {}).get("deletionTimestamp"):
        _state(memo).known.add((namespace, name))
    return {(namespace, name): {
        "spec": _parsed(body.get("spec")),
        "fingerprint": (body.get("status") or {}).get("nodesFingerprint"),
        "trigger": annotations.get(names.ANNOTATION_NODES_CHANGED),
    }}


def _all_nodes(index: kopf.Index) -> list[NodeSummary]:
    return [summary for store in index.values() for summary in store]


def _parsed(spec: Any) -> ModelServerSpec | SpillwayError:
    """The parsed spec, or why it does not parse."""
    try:
        return parse_spec(spec)
    except SpillwayError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - a bug must not take the index (and every tenant) down
        return InternalError.of(exc)


@kopf.on.event("", "v1", "nodes")
async def node_changed(gpu_nodes: kopf.Index, modelservers: kopf.Index, memo: kopf.Memo, **_: Any) -> None:
    """Runs in kopf's event loop, where the indexes change: a snapshot, handed to the one re-plan worker."""
    state = _state(memo)
    if not state.node_index:
        state.node_index.append(gpu_nodes)  # the live index, for the resync
        # Started from a handler: its context (kopf's event posting) goes with the resync's reconciles.
        context = contextvars.copy_context()
        threading.Thread(target=context.run, args=(_resync_forever, state), name="spillway-resync",
                         daemon=True).start()
    nodes = tuple(_all_nodes(gpu_nodes))
    metrics.publish_nodes(list(nodes))
    # The fingerprint each reconcile wrote, as this process knows it: the index sees a status write late or
    # not at all (a status-only change need not reach the watch).
    state.replanner.offer(nodes, {key: {**entry, "fingerprint": state.fingerprints.get(key, entry["fingerprint"])}
                                  for key, store in modelservers.items() for entry in store})


def _replan_now(state: OperatorState, namespace: str, name: str, fingerprint: str,
                nodes: tuple[NodeSummary, ...]) -> None:
    """A node-driven re-plan: the ModelServer as it is now, for the nodes of the change. On an API error the
    trigger annotation hands the re-plan to kopf, which retries it."""
    with state.lock(namespace, name):
        try:
            ms = state.kube.get(_ms_path(namespace, name))
            if ms is None or (ms.get("metadata") or {}).get("deletionTimestamp"):
                return
            if (ms.get("status") or {}).get("nodesFingerprint") == fingerprint:
                return  # a reconcile since the change already planned for these nodes
            reconcile(state, ms, list(nodes), _replan_log)
        except (ApiError, *TRANSPORT_ERRORS) as exc:
            _replan_log.warning(f"re-plan of {namespace}/{name} failed ({exc}): handing it to the retrying handler")
            state.kube.merge_patch(_ms_path(namespace, name),
                                   {"metadata": {"annotations": {names.ANNOTATION_NODES_CHANGED: fingerprint}}})


def _current_nodes(state: OperatorState) -> list[NodeSummary]:
    """The GPU nodes' index as it is now, read from the resync's thread (kopf's loop may change it meanwhile)."""
    for _ in range(5):
        try:
            return _all_nodes(state.node_index[0]) if state.node_index else []
        except RuntimeError:  # changed size during iteration: read again
            time.sleep(0.05)
    return []


def resync_once(state: OperatorState) -> None:
    """Every known ModelServer reconciled once, event or not: what only this operator writes (the status, the
    planned objects) but someone else changed is put back, and a pass lost to an error is made again."""
    nodes = _current_nodes(state)
    if not state.node_index:
        return  # no node event yet: the index is not filled, and a plan for no nodes would be wrong
    for namespace, name in sorted(state.known):
        with state.lock(namespace, name):
            try:
                ms = state.kube.get(_ms_path(namespace, name))
                if ms is None:
                    state.known.discard((namespace, name))
                    continue
                if not (ms.get("metadata") or {}).get("deletionTimestamp"):
                    reconcile(state, ms, nodes, _resync_log)
            except (ApiError, *TRANSPORT_ERRORS) as exc:
                _resync_log.warning(f"resync of {namespace}/{name} failed ({exc}); the next one tries again")
            except Exception:  # noqa: BLE001 - one ModelServer's bug must not stop the others' resync
                _resync_log.exception(f"resync of {namespace}/{name} failed")


def _resync_forever(state: OperatorState) -> None:
    while True:
        time.sleep(state.settings.resync_seconds)
        resync_once(state)


# -- reconcile -------------------------------------------------------------------------------------------

def _config_map_reader(kube: Kube, namespace: str):
    def read(name: str, key: str) -> str | None:
        found = kube.get(path("v1", "ConfigMap", namespace, name))
        return None if found is None else (found.get("data") or {}).get(key)
    return read


def _hub_fetcher(state: OperatorState, namespace: str, spec: ModelServerSpec) -> HubFetcher | None:
    if not state.settings.allow_hub_fetch:
        return None

    def fetch(model: str, revision: str | None) -> dict[str, Any]:
        token = None
        ref = spec.hf_token_secret
        if ref is not None:
            try:
                secret = state.kube.get(path("v1", "Secret", namespace, ref.name))
            except ApiError as exc:
                if exc.status != 403:
                    raise
                raise ModelGeometryUnknown(
                    f"the operator may not read Secret {ref.name} in namespace {namespace} (the chart grants Secret "
                    "reads only in operator.watchNamespaces): give spec.modelConfig instead") from exc
            encoded = ((secret or {}).get("data") or {}).get(ref.key)
            try:
                token = base64.b64decode(encoded).decode().strip() if encoded else None
            except ValueError as exc:  # binascii.Error, UnicodeDecodeError
                raise ModelGeometryUnknown(f"Secret {ref.name} key {ref.key} is not a token") from exc
        return fetch_config(model, revision or "main", token)
    return fetch


def _pod_monitors_wanted(state: OperatorState) -> bool:
    if not state.settings.pod_monitors:
        return False
    return state.kube.serves(names.PODMONITOR_GROUP, names.PODMONITOR_VERSION, names.PODMONITOR_PLURAL)


def _keda_served(kube: Kube) -> bool:
    return kube.serves(scaling.KEDA_GROUP, scaling.KEDA_VERSION, scaling.KEDA_PLURAL)


def _event(body: Mapping[str, Any], reason: str, message: str, warning: bool = False) -> None:
    kopf.event(body, type="Warning" if warning else "Normal", reason=reason, message=message[:1000])


def _deployment(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    return kube.get(path("apps/v1", "Deployment", namespace, name))


def _write_status(kube: Kube, namespace: str, name: str, old_status: Mapping[str, Any], update: dict[str, Any]) -> None:
    """One merge patch of the status, retried a few times on the API server's passing trouble: a Deployment
    event that loses its status write is not redelivered, so Ready would stay wrong until the next one."""
    old_plan = old_status.get("plan") or {}
    if "plan" in update:  # a merge patch keeps keys it does not name: null the ones the new plan lacks
        update["plan"] = {**{k: None for k in old_plan if k not in update["plan"]}, **update["plan"]}
    for attempt, delay in enumerate((*STATUS_RETRY_SECONDS, None)):
        try:
            kube.merge_patch(_ms_path(namespace, name, "status"), {"status": update})
            return
        except ApiError as exc:
            if exc.status == 404:
                return  # the ModelServer is gone: there is nothing to write to
            if delay is None or not (exc.status >= 500 or exc.status in (409, 429)):
                raise
        except (OSError, urllib3.exceptions.HTTPError):  # the connection itself
            if delay is None:
                raise
        logging.getLogger("kopf.objects").warning(
            f"status write of {namespace}/{name} failed (attempt {attempt + 1}); retrying in {delay:g} s")
        time.sleep(delay)


@dataclass
class _Pass:
    """What one reconcile has found so far, handed from step to step."""

    namespace: str
    name: str
    generation: int | None
    status: Mapping[str, Any]  # the status as the pass began
    spec: ModelServerSpec | SpillwayError
    update: dict[str, Any]  # the status merge patch being built
    result: Desired | None = None
    error: SpillwayError | None = None
    planned: dict[str, Any] = field(default_factory=dict)  # the Planned condition
    live: dict[tuple[str, str], Any] = field(default_factory=dict)  # what the name-conflict check read
    refused: list[str] = field(default_factory=list)  # what the prune may not delete
    uid: str | None = None
    # When the ModelServer was last seen to exist: never, at first: the body a pass begins with may be a stale
    # copy (kopf runs a handler again on the body it had when its own bookkeeping patch failed on a deleted object).
    checked: float = float("-inf")
    deleted: bool = False  # it was deleted (or replaced) during the pass: nothing more is written for it


def _gone(kube: Kube, step: _Pass, logger: logging.Logger) -> bool:
    """Whether the ModelServer was deleted (or deleted and created again: another uid) since the pass began, read
    at most every OWNER_CHECK_SECONDS: a slow pass must not go on writing objects and a status for it."""
    if step.deleted:
        return True
    if time.monotonic() - step.checked < OWNER_CHECK_SECONDS:
        return False
    live = kube.get(_ms_path(step.namespace, step.name))
    step.checked = time.monotonic()
    meta = (live or {}).get("metadata") or {}
    step.deleted = live is None or bool(meta.get("deletionTimestamp")) or (
        step.uid is not None and meta.get("uid") != step.uid)
    if step.deleted:
        logger.info(f"{step.namespace}/{step.name} was deleted during its reconcile: nothing more is written")
    return step.deleted


def reconcile(state: OperatorState, body: Mapping[str, Any], nodes: list[NodeSummary],
              logger: logging.Logger) -> None:
    """One pass for one ModelServer: plan, apply (and prune), write the status."""
    step = _begin(body, nodes)
    _plan(state, body, step, nodes, logger)
    if step.result is not None:
        _apply_and_prune(state, body, step, logger)
    if not _gone(state.kube, step, logger):
        _finish_status(state, body, step)


def _begin(body: Mapping[str, Any], nodes: list[NodeSummary]) -> _Pass:
    """The spec parsed once (the eligible nodes, the hub and the retry read it) and the status patch's
    fields every outcome writes."""
    meta = body.get("metadata") or {}
    namespace, name = meta.get("namespace") or "default", meta["name"]
    generation = meta.get("generation")
    update: dict[str, Any] = {"selector": ",".join(f"{k}={v}" for k, v in selector(name).items())}
    if generation is not None:
        update["observedGeneration"] = generation
    return _Pass(namespace, name, generation, body.get("status") or {}, _parsed(body.get("spec")), update,
                 uid=meta.get("uid"))


def _plan(state: OperatorState, body: Mapping[str, Any], step: _Pass, nodes: list[NodeSummary], logger: logging.Logger) -> None:
    """The eligible nodes, the plan and the objects, and whether their names are free; any failure but the
    API server's becomes this ModelServer's Planned=False condition and one Warning event."""
    old_planned = cond.find(step.status.get("conditions"), cond.PLANNED)
    spec, eligible = step.spec, None
    try:
        eligible = eligibility(nodes, spec) if isinstance(spec, ModelServerSpec) else None
    except Exception as exc:  # noqa: BLE001 - reported as this resource's status below
        step.spec = spec = exc if isinstance(exc, SpillwayError) else InternalError.of(exc)
    if eligible is not None and eligible.fingerprint is not None:
        step.update["nodesFingerprint"] = eligible.fingerprint
    try:
        check_name(body)
        if not isinstance(spec, ModelServerSpec):
            raise spec
        assert eligible is not None
        result = desired_for(body, spec, eligible, _config_map_reader(state.kube, step.namespace),
                             _hub_fetcher(state, step.namespace, spec), _pod_monitors_wanted(state),
                             state.settings.router_image, functools.partial(_keda_served, state.kube))
        check_disk_volume(result, step.namespace, state.kube, state.settings.disk_host_path_prefixes)
        check_compile_cache_claim(spec, step.namespace, state.kube)
        for obj in result.objects:  # nothing is written while one name is taken by an object not ours
            taken, step.live[(obj["kind"], obj["metadata"]["name"])] = state.kube.conflict_live(obj)
            if taken is not None:
                raise NameConflict(taken)
    except (ApiError, *TRANSPORT_ERRORS):
        raise  # the API server's (or the connection's) trouble: retried
    except Exception as caught:  # contained: a status and an event, never a failed handler
        exc = caught if isinstance(caught, SpillwayError) else InternalError.of(caught)
        if not isinstance(caught, SpillwayError):
            logger.error(f"planning {step.namespace}/{step.name} failed unexpectedly", exc_info=caught)
        step.error = exc
        step.planned = cond.condition(cond.PLANNED, False, exc.reason, error_line(exc), step.generation)
        logger.warning(f"{exc.reason}: {error_line(exc)}")
        if old_planned is None or old_planned.get("message") != step.planned["message"]:
            _event(body, exc.reason, step.planned["message"], warning=True)
        return
    step.result = result
    summary = result.summary()
    step.planned = cond.condition(cond.PLANNED, True, cond.REASON_PLANNED, summary, step.generation)
    if old_planned is None or old_planned.get("message") != summary:
        _event(body, "Replanned" if old_planned is not None else "Planned", summary)


def _apply_and_prune(state: OperatorState, body: Mapping[str, Any], step: _Pass, logger: logging.Logger) -> None:
    """Server-side apply of the planned objects (the Deployment's owned fields taken back whole), then the
    prune of what routing no longer uses. An object the API server refuses is the spec's fault: a condition,
    not endless retries."""
    assert step.result is not None and isinstance(step.spec, ModelServerSpec)
    try:
        for api_version, kind, obj_name in scaling.displaced(step.result.objects, step.name) if step.uid else ():
            if state.kube.delete_controlled(path(api_version, kind, step.namespace, obj_name), step.uid) == "deleted":
                _event(body, "Deleted", f"deleted {kind} {obj_name}: the ScaledObject replaces it")
        for obj in step.result.objects:
            if _gone(state.kube, step, logger):
                return
            if obj["kind"] == "Deployment" and step.generation is not None:
                obj["metadata"].setdefault("annotations", {})[names.ANNOTATION_PLANNED_GENERATION] = str(
                    step.generation)
            outcome, after = state.kube.apply_live(obj, step.live[(obj["kind"], obj["metadata"]["name"])])
            if obj["kind"] == "Deployment":
                outcome = _own_deployment(state, obj, outcome, after, logger)
            if outcome != "unchanged":
                _event(body, outcome.capitalize(), f"{outcome} {obj['kind']} {obj['metadata']['name']}")
                logger.info(f"{outcome} {obj['kind']} {step.namespace}/{obj['metadata']['name']}")
    except ApiError as exc:
        if exc.status not in API_REFUSALS:
            raise  # the API server's trouble: retried
        # What the schema let through (preserve-unknown affinity, env valueFrom) but the API server refuses
        # in a pod: the spec's fault, reported on it, not retried forever.
        step.error = InvalidSpec(f"the API server refused {obj['kind']} {obj['metadata']['name']}: {exc}")
        step.planned = cond.condition(cond.PLANNED, False, step.error.reason, error_line(step.error),
                                      step.generation)
        _event(body, step.error.reason, step.planned["message"], warning=True)
        return
    step.update["plan"] = status_plan(step.result)
    # status.autoscaler: the kind spec.autoscaling rendered (None clears it), so the pass after it goes prunes it
    autoscaler = next((o["kind"] for o in step.result.objects if o["kind"] in AUTOSCALER_KINDS), None)
    step.update["autoscaler"] = autoscaler
    # after the Service <name> selects its new pods
    if (step.spec.routing.enabled or _was_routed(step.status) or autoscaler or step.status.get("autoscaler")) \
            and not _gone(state.kube, step, logger):
        step.refused = _prune(state.kube, body, step.spec, step.result.objects, logger)


def _finish_status(state: OperatorState, body: Mapping[str, Any], step: _Pass) -> None:
    """Ready, Degraded and Routed from the Deployment, the plan and the failure; one status merge patch. A
    Deployment planned from this very spec whose nodes shrank below it is scaled to zero; a ConfigMap the
    model's config.json may still appear in is waited for."""
    namespace, name, generation, error = step.namespace, step.name, step.generation, step.error
    kube = state.kube
    deployment = _deployment(kube, namespace, name)
    if isinstance(error, PoolDoesNotFit) and _no_longer_fits(deployment, generation):
        # The spec it was planned from is unchanged: the nodes shrank. Its pods would not fit (or be
        # OOM-killed) wherever they restart, so none are left to try until the nodes fit the plan again.
        kube.merge_patch(path("apps/v1", "Deployment", namespace, name), {"spec": {"replicas": 0}})
        _event(body, "ScaledToZero", f"the nodes no longer fit the applied plan: {error_line(error)}", warning=True)
        deployment = _deployment(kube, namespace, name)
    metrics.publish_planned(namespace, name, error is None)
    update = step.update
    routed = _routing_status(kube, namespace, name, step.spec, deployment, step.result, generation, update)
    routed = _unrouted_condition(step.status, update, routed, step.refused, generation)
    autoscaled = scaling.condition(step.result.autoscaling, bool(cond.find(
        step.status.get("conditions"), scaling.AUTOSCALED)), generation) if step.result is not None else None
    update["conditions"] = cond.merge(step.status.get("conditions"), [
        step.planned, cond.ready_condition(deployment, generation),
        cond.degraded_condition(step.planned, deployment, generation),
    ] + [c for c in (routed, autoscaled) if c is not None])
    update.update(cond.ready_counts(deployment))
    _write_status(kube, namespace, name, step.status, update)
    if "nodesFingerprint" in update:
        state.fingerprints[(namespace, name)] = update["nodesFingerprint"]
    retry = state.settings.retry_seconds
    if isinstance(error, ModelGeometryUnknown) and _waits_for_config_map(step.spec):
        raise kopf.TemporaryError(f"waiting for the model's ConfigMap: {error_line(error)}", delay=retry)
    if isinstance(error, ClaimNotFound):  # a claim created later is found on the retry
        raise kopf.TemporaryError(f"waiting for the claim: {error_line(error)}", delay=retry)


def _own_deployment(state: OperatorState, obj: dict[str, Any], outcome: str, live: dict[str, Any] | None,
                    logger: logging.Logger) -> str:
    """Takes back the owned fields another manager changed (drift.py), and remembers what they should be, so
    that a Deployment event can tell a hand edit from the operator's own write. `live`: the Deployment after
    the apply."""
    meta = obj["metadata"]
    url = path("apps/v1", "Deployment", meta["namespace"], meta["name"])
    live = live if live is not None else state.kube.get(url)
    patch = drift.restore_patch(live, obj) if live is not None else None
    if patch is not None:
        logger.info(f"Deployment {meta['namespace']}/{meta['name']}: restoring {', '.join(drift.drifted(live, drift.owned(obj)))}")
        state.kube.merge_patch(url, patch)
        outcome = "updated"
    state.applied_owned[(meta["namespace"], meta["name"])] = drift.owned(obj)
    return outcome


def _routing_status(kube: Kube, namespace: str, name: str, spec: Any, deployment: Mapping[str, Any] | None,
                    result: Desired | None, generation: int | None, update: dict[str, Any]) -> dict[str, Any] | None:
    """status.routing into `update`; the Routed condition (None when the ModelServer is not routed)."""
    if not isinstance(spec, ModelServerSpec):
        return None
    router = kube.get(path("apps/v1", "Deployment", namespace, router_name(name))) if spec.routing.enabled else None
    llm_d = spec.routing.mode == MODE_LLM_D
    credit = host_tier_credit(spec, result.plan) if result is not None and llm_d else None
    update["routing"], routed = routing_status(name, namespace, spec, deployment, router, generation, credit)
    return routed


def _was_routed(status: Mapping[str, Any]) -> bool:
    """Whether a routed mode may have left objects: the last status says so, or holds no record at all of the
    routing (a reconcile whose status write never landed)."""
    routing = status.get("routing")
    return not isinstance(routing, Mapping) or routing.get("mode") not in (None, MODE_NONE) or bool(
        routing.get("warnings"))


def _prune(kube: Kube, body: Mapping[str, Any], spec: ModelServerSpec, objects: list[dict[str, Any]],
           logger: logging.Logger) -> list[str]:
    """Deletes what a routed mode added and the desired objects no longer hold (routing.mode switched to none or
    to the other mode): only objects this ModelServer controls, by uid, never a same-named one of a user or of
    another owner. What the operator may not delete comes back as lines for the status, never as a failure."""
    meta = body["metadata"]
    namespace, name, uid = meta.get("namespace") or "default", meta["name"], meta.get("uid")
    if not uid:
        return []
    wanted = {(obj["kind"], obj["metadata"]["name"]) for obj in objects}
    refused = []
    for api_version, kind, obj_name in routing_object_keys(name):
        if (kind, obj_name) in wanted:
            continue
        try:
            outcome = kube.delete_controlled(path(api_version, kind, namespace, obj_name), uid)
        except ApiError as exc:
            if exc.status != 403:
                raise  # the API server's trouble: retried
            refused.append(f"{kind} {obj_name} is left running: the operator may not delete it ({exc}); "
                           f"delete it by hand (routing.mode {spec.routing.mode} does not use it)")
            _event(body, REASON_PRUNE_FORBIDDEN, refused[-1], warning=True)
            continue
        if outcome == "deleted":
            _event(body, "Pruned", f"deleted {kind} {obj_name}: routing.mode {spec.routing.mode} does not use it")
            logger.info(f"deleted {kind} {namespace}/{obj_name} (routing.mode {spec.routing.mode})")
    return refused


def _unrouted_condition(status: Mapping[str, Any], update: dict[str, Any], routed: dict[str, Any] | None,
                        refused: list[str], generation: int | None) -> dict[str, Any] | None:
    """The Routed condition with what could not be pruned: a routed mode's in status.routing.warnings; an
    unrouted ModelServer's Routed condition says so (False PruneForbidden), and one it had from a routed mode
    turns False NotRouted rather than claiming a router it no longer has."""
    if routed is not None:
        if refused and "routing" in update:
            update["routing"]["warnings"] = [*update["routing"].get("warnings", []), *refused]
        return routed
    if "routing" not in update:  # the spec does not parse: nothing is known of its routing
        return None
    # A merge patch keeps the keys it does not name: null what the routed mode had (routerReady, ...).
    old_routing = status.get("routing") or {}
    update["routing"] = {**{k: None for k in old_routing if k not in update["routing"]}, **update["routing"]}
    if refused:
        update["routing"]["warnings"] = refused
        return cond.condition(ROUTED, False, REASON_PRUNE_FORBIDDEN, "; ".join(refused), generation)
    if cond.find(status.get("conditions"), ROUTED) is not None:
        return cond.condition(ROUTED, False, REASON_NOT_ROUTED,
                              "routing.mode none: the Service selects the vLLM pods", generation)
    return None


def _router_changed(kube: Kube, ms: Mapping[str, Any], namespace: str, name: str) -> None:
    spec = _parsed(ms.get("spec"))
    status = ms.get("status") or {}
    update: dict[str, Any] = {}
    routed = _routing_status(kube, namespace, name, spec, _deployment(kube, namespace, name), None,
                             (ms.get("metadata") or {}).get("generation"), update)
    if routed is None:
        return
    update["routing"]["hostTierCredit"] = (status.get("routing") or {}).get("hostTierCredit")
    update["conditions"] = cond.merge(status.get("conditions"), [routed])
    _write_status(kube, namespace, name, status, update)


def _planned_generation(deployment: Mapping[str, Any] | None) -> int | None:
    found = (((deployment or {}).get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_PLANNED_GENERATION)
    return int(found) if found is not None and str(found).isdigit() else None


def _no_longer_fits(deployment: Mapping[str, Any] | None, generation: int | None) -> bool:
    """A running Deployment planned from this very generation: what changed is the nodes, not the spec."""
    running = int(((deployment or {}).get("spec") or {}).get("replicas") or 0) > 0
    return running and generation is not None and _planned_generation(deployment) == generation


def _waits_for_config_map(spec: ModelServerSpec | SpillwayError) -> bool:
    """A ModelServer whose config.json is in a ConfigMap: it may appear later, so the reconcile is retried."""
    source = spec.model_config if isinstance(spec, ModelServerSpec) else None
    return source is not None and source.config_map is not None


@kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile")
@kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile")
@kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile")
def on_modelserver(body: kopf.Body, namespace: str, name: str, gpu_nodes: kopf.Index, memo: kopf.Memo,
                   logger: logging.Logger, **_: Any) -> None:
    state = _state(memo)
    with state.lock(namespace, name):
        nodes = _all_nodes(gpu_nodes)
        try:
            reconcile(state, body, nodes, logger)
        except (ApiError, *TRANSPORT_ERRORS) as exc:
            raise kopf.TemporaryError(f"{type(exc).__name__}: {exc}"[:1000],
                                      delay=state.settings.retry_seconds) from exc
    _replan_if_nodes_moved(state, namespace, name, body, nodes, _all_nodes(gpu_nodes))


def _replan_if_nodes_moved(state: OperatorState, namespace: str, name: str, body: Mapping[str, Any], planned_for: list[NodeSummary],
                           now: list[NodeSummary]) -> None:
    """A node change while this reconcile ran found no fingerprint to compare (the re-plan worker skips a
    ModelServer never planned): re-plan for the nodes as they are now."""
    spec = _parsed(body.get("spec"))
    if not isinstance(spec, ModelServerSpec):
        return
    latest = eligibility(now, spec).fingerprint
    if latest is not None and latest != eligibility(planned_for, spec).fingerprint:
        _replan_now(state, namespace, name, latest, tuple(now))


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def on_delete(namespace: str, name: str, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    # Owner references let the garbage collector remove the Deployment, Service and PodMonitor.
    logger.info(f"{namespace}/{name} deleted; its objects go with it (owner references)")
    metrics.publish_planned(namespace, name, None)
    _state(memo).forget(namespace, name)


# -- readiness -------------------------------------------------------------------------------------------

@kopf.on.event("apps", "v1", "deployments", labels={names.LABEL_MANAGED_BY: names.MANAGED_BY})
def deployment_changed(body: kopf.Body, type: str | None, namespace: str, gpu_nodes: kopf.Index, memo: kopf.Memo,
                       logger: logging.Logger, **_: Any) -> None:
    owner = ((body.get("metadata") or {}).get("labels") or {}).get(names.LABEL_MODELSERVER)
    if not owner:
        return
    state = _state(memo)
    with state.lock(namespace, owner):
        ms = state.kube.get(_ms_path(namespace, owner))
        if ms is None or (ms.get("metadata") or {}).get("deletionTimestamp"):
            return
        if type == "DELETED":
            logger.info(f"Deployment {namespace}/{owner} was deleted: applying it again")
            reconcile(state, ms, _all_nodes(gpu_nodes), logger)
            return
        if ((body.get("metadata") or {}).get("labels") or {}).get(names.LABEL_COMPONENT) == names.COMPONENT_ROUTER:
            _router_changed(state.kube, ms, namespace, owner)
            return
        applied = state.applied_owned.get((namespace, owner))
        edited = drift.drifted(body, applied) if applied is not None else []
        if edited:
            logger.warning(f"Deployment {namespace}/{owner}: {', '.join(edited)} edited by hand: applying the plan again")
            reconcile(state, ms, _all_nodes(gpu_nodes), logger)
            return
        status = ms.get("status") or {}
        generation = (ms.get("metadata") or {}).get("generation")
        planned = cond.find(status.get("conditions"), cond.PLANNED)
        deployment = dict(body)
        old_ready = cond.find(status.get("conditions"), cond.READY)
        ready = cond.ready_condition(deployment, generation)
        update = {"conditions": cond.merge(status.get("conditions"), [
            ready, cond.degraded_condition(planned, deployment, generation)]), **cond.ready_counts(deployment)}
        if old_ready is None or old_ready.get("status") != ready["status"]:
            _event(ms, ready["reason"], ready["message"])
        _write_status(state.kube, namespace, owner, status, update)
