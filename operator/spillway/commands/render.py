"""`spillway render`: print the objects the operator would apply for a ModelServer, offline.

Same code path as the operator (manifests.desired); the cluster's nodes are described with
--node-memory/--gpus-per-node or read from a file of Node objects (`kubectl get nodes -o yaml`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from ..controller.facts import NodeSummary, eligibility, summarize_node, synthetic_node
from ..controller.manifests import Desired, check_name, desired_for
from ..controller.spec import ModelServerSpec, check_document, parse_spec
from ..core import k8s_names as names
from ..core.errors import InvalidSpec
from ..core.quantity import parse_bytes, parse_cpu_millis
from .plan import add_node_hugepages

MAX_INPUT_BYTES = 16 * 2**20  # ModelServer, Node and config.json files: far more than any real one


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("render", help="print the Deployment/Service/PodMonitor the operator applies "
                                             "for a ModelServer")
    p.add_argument("-f", "--filename", required=True, help="ModelServer YAML/JSON ('-' reads stdin)")
    p.add_argument("--node-memory", help="allocatable memory of the GPU nodes, e.g. 2Ti")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node")
    p.add_argument("--node-cpus", help="allocatable CPU of the GPU nodes, e.g. 128 (sets the API servers)")
    p.add_argument("--node-ephemeral-storage", help="allocatable ephemeral storage of the GPU nodes, e.g. 3Ti "
                   "(sizes an emptyDir disk tier)")
    add_node_hugepages(p)
    p.add_argument("--nodes", metavar="PATH", help="Node objects (kubectl get nodes -o yaml) instead of the two above")
    p.add_argument("--model-config", metavar="PATH", help="config.json for a modelConfig.configMapRef")
    p.add_argument("--pod-monitor", action="store_true", help="also render the PodMonitor (clusters with the "
                                                              "Prometheus operator)")
    p.add_argument("--output", "-o", default="yaml", choices=["yaml", "json"])
    p.set_defaults(func=run)


def _documents(path: str) -> list[dict[str, Any]]:
    text = sys.stdin.read() if path == "-" else _read(path)
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise InvalidSpec(f"{path}: not YAML: {exc}") from exc
    except RecursionError as exc:
        raise InvalidSpec(f"{path}: nested too deeply") from exc
    except ValueError as exc:  # an integer past Python's digit limit (sys.get_int_max_str_digits)
        raise InvalidSpec(f"{path}: a number too long for any field ({exc})"[:300]) from exc
    for doc in docs:
        check_document(doc, path)
    items: list[dict[str, Any]] = []
    for doc in docs:
        items.extend(doc.get("items", []) if isinstance(doc, dict) and doc.get("kind", "").endswith("List") else [doc])
    return items


def _read(path: str) -> str:
    """A file's text, read with a bound (the path may be a device or a pipe) and decoded as UTF-8."""
    try:
        with Path(path).open("rb") as file:
            data = file.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise InvalidSpec(f"cannot read {path}: {exc.strerror}") from exc
    if len(data) > MAX_INPUT_BYTES:
        raise InvalidSpec(f"{path}: larger than {MAX_INPUT_BYTES // 2**20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidSpec(f"{path}: not UTF-8 text at byte {exc.start}") from exc


def _model_servers(path: str) -> list[dict[str, Any]]:
    found = [d for d in _documents(path)
             if isinstance(d, dict) and d.get("kind") == names.KIND and d.get("apiVersion") == names.API_VERSION]
    if not found:
        raise InvalidSpec(f"{path} holds no {names.API_VERSION} {names.KIND}")
    return found


def _nodes(args: argparse.Namespace, spec: ModelServerSpec) -> list[NodeSummary]:
    if args.nodes:
        nodes = [summarize_node(d) for d in _documents(args.nodes) if isinstance(d, dict) and d.get("kind") == "Node"]
        return [n for n in nodes if n is not None]
    if args.node_memory is None or args.gpus_per_node is None:
        raise InvalidSpec("describe the GPU nodes: --node-memory and --gpus-per-node, or --nodes FILE")
    if args.node_cpus is not None:
        parse_cpu_millis(args.node_cpus, "--node-cpus")  # a bad value is an error here, not an unknown CPU
    # The described node carries the spec's nodeSelector labels: it stands for the pool the spec selects.
    ephemeral, hugepages = getattr(args, "node_ephemeral_storage", None), getattr(args, "node_hugepages", None)
    for flag, value in (("--node-ephemeral-storage", ephemeral), ("--node-hugepages", hugepages)):
        if value is not None:
            parse_bytes(value, flag)  # a bad value is an error here: the Node's reader would take it as unknown
    summary = summarize_node(synthetic_node(args.node_memory, args.gpus_per_node, labels=spec.node_selector,
                                            cpu=args.node_cpus, ephemeral_storage=ephemeral, hugepages_2mi=hugepages))
    if summary is None:
        raise InvalidSpec(f"--node-memory {args.node_memory} / --gpus-per-node {args.gpus_per_node} "
                          "describe no GPU node")
    return [summary]


def render_one(args: argparse.Namespace, body: dict[str, Any]) -> Desired:
    config_text = _read(args.model_config) if args.model_config else None
    reader = (lambda _name, _key: config_text) if config_text is not None else None
    check_name(body)
    spec = parse_spec(body.get("spec"))  # once: the described node carries its nodeSelector
    return desired_for(body, spec, eligibility(_nodes(args, spec), spec), read_config_map=reader,
                       pod_monitor=args.pod_monitor)


def run(args: argparse.Namespace) -> int:
    results = [render_one(args, body) for body in _model_servers(args.filename)]
    objects = [obj for result in results for obj in result.objects]
    if args.output == "json":
        sys.stdout.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n")
        return 0
    out = []
    for result in results:
        meta = result.objects[0]["metadata"]
        out.append(f"# {names.KIND} {meta['namespace']}/{meta['name']}: {result.summary()}\n")
        out += [f"# warning: {w}\n" for w in result.plan.warnings]
    out.append(yaml.safe_dump_all(objects, sort_keys=False, explicit_start=True))
    sys.stdout.write("".join(out))
    return 0
