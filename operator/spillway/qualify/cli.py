"""`spillway qualify`: measure this node's GPU<->pinned-CPU copy rates; optionally record them on the Node.

    spillway qualify                          # table on stdout (needs a CUDA GPU)
    spillway qualify --json out.json          # and the full result as JSON
    spillway qualify --annotate-node NODE     # and patch the Node (in a pod with the rendered RBAC)
    spillway qualify --render daemonset       # print the DaemonSet + RBAC that do this on every GPU node
    spillway qualify --render job --node N    # or a one-off Job for node N
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time

import yaml

from ..core import k8s_names as names
from ..core.errors import InvalidSpec
from ..core.qualification import DIRECTIONS, HOST_KINDS, METHODS, PLAN_BLOCK_BYTES, node_patch
from ..core.quantity import parse_bytes
from . import manifests
from .measure import BLOCKS_PER_TRANSFER, DEFAULT_BLOCK_SIZES
from .report import document, format_table


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("qualify", help="measure GPU<->pinned-CPU copy rates on this node (KV offload path)")
    p.add_argument("--block-sizes", help="comma-separated block sizes (quantities); default 4Ki..16Mi, "
                   "rendered manifests 64Ki..4Mi")
    p.add_argument("--blocks", type=int, default=BLOCKS_PER_TRANSFER, help="blocks per timed transfer")
    p.add_argument("--repeats", type=int, default=5, help="timed transfers per cell (after one checked warm-up)")
    p.add_argument("--methods", default=",".join(METHODS), help=f"subset of {','.join(METHODS)}")
    p.add_argument("--directions", default=",".join(DIRECTIONS), help=f"subset of {','.join(DIRECTIONS)}")
    p.add_argument("--host-memory", default="alloc", choices=HOST_KINDS,
                   help="alloc: cudaHostAlloc; shm: /dev/shm mmap + cudaHostRegister (vLLM >= 0.27's pool)")
    p.add_argument("--bidir-submit", default="interleaved", choices=["interleaved", "sequential"],
                   help="dma method, both directions: alternate the two streams' copies, or submit one after the other")
    p.add_argument("--plan-block-size", default=str(PLAN_BLOCK_BYTES),
                   help="block size whose CPU->GPU rate is annotated (default: Llama-3.1-8B's block at the "
                        "planner's default block size, 8 MiB)")
    p.add_argument("--disk", metavar="DIR", help="instead: measure the disk read rate into the CPU pool under DIR "
                   "(the disk tier's volume), the way vLLM's fs tier reads")
    p.add_argument("--disk-chunk-size", default="2Mi", help="bytes per chunk file (--disk)")
    p.add_argument("--disk-chunks", type=int, default=256, help="chunk files written and read back (--disk)")
    p.add_argument("--disk-threads", type=int, default=None, help="reader threads (--disk; default: the plan's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="write the full result as JSON ('-' for stdout)")
    p.add_argument("--annotate-node", metavar="NODE", help="patch this Node's annotations (in-cluster)")
    p.add_argument("--hold", action="store_true", help="after success, wait until the pod is deleted (DaemonSet)")
    p.add_argument("--render", choices=["daemonset", "job"], help="print manifests instead of measuring")
    p.add_argument("--node", help="the node a rendered Job runs on")
    p.add_argument("--namespace", default=manifests.DEFAULT_NAMESPACE)
    p.add_argument("--image", default=names.DEFAULT_VLLM_IMAGE, help="an image with vLLM and spillway installed")
    p.add_argument("--gpu-node-label", default=manifests.DEFAULT_GPU_NODE_LABEL, help="KEY=VALUE of GPU nodes")
    p.set_defaults(func=run)


def parse_sizes(text: str) -> list[int]:
    sizes = [parse_bytes(t.strip(), "--block-sizes") for t in text.split(",") if t.strip()]
    if not sizes:
        raise InvalidSpec("--block-sizes is empty")
    for s in sizes:
        if s < 8 or s % 8:
            raise InvalidSpec(f"--block-sizes: {s} is not a positive multiple of 8 bytes")
    return sorted(set(sizes))


def parse_choice(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise InvalidSpec(f"{flag}: expected a subset of {','.join(allowed)}, got {text!r}")
    return list(dict.fromkeys(items))


def render(args: argparse.Namespace) -> str:
    sizes = parse_sizes(args.block_sizes) if args.block_sizes else list(manifests.RENDER_BLOCK_SIZES)
    host = args.host_memory
    names.require_name(args.namespace, "--namespace")
    if args.node:
        names.require_name(args.node, "--node", subdomain=True)
    if args.render == "daemonset":
        objs = manifests.daemonset(args.namespace, args.image, sizes, host, args.repeats, args.gpu_node_label)
    else:
        if not args.node:
            raise InvalidSpec("--render job needs --node NAME")
        objs = manifests.job(args.namespace, args.image, args.node, sizes, host, args.repeats)
    return yaml.safe_dump_all(objs, sort_keys=False)


def run_disk(args: argparse.Namespace) -> int:
    from ..core.disk_tier import ANNOTATION_QUALIFIED_DISK_GBPS, READ_THREADS
    from .disk import measure_disk_read

    rate = measure_disk_read(args.disk, parse_bytes(args.disk_chunk_size, "--disk-chunk-size"), args.disk_chunks,
                             args.disk_threads or READ_THREADS)
    print(f"disk -> CPU pool at {rate.chunk_bytes} B chunks, {rate.threads} threads "
          f"({'O_DIRECT' if rate.o_direct else 'buffered'}): {rate.gbps} GB/s")
    if args.json:
        text = json.dumps(rate.as_dict(), indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    if args.annotate_node:
        from .node import ApiServer, patch_node

        patch_node(args.annotate_node, {"metadata": {"annotations": {ANNOTATION_QUALIFIED_DISK_GBPS: str(rate.gbps)}}},
                   ApiServer.in_cluster())
        print(f"annotated node {args.annotate_node}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.disk:
        return run_disk(args)
    if args.render:
        sys.stdout.write(render(args))
        return 0
    sizes = parse_sizes(args.block_sizes) if args.block_sizes else list(DEFAULT_BLOCK_SIZES)
    methods = parse_choice(args.methods, METHODS, "--methods")
    directions = parse_choice(args.directions, DIRECTIONS, "--directions")
    plan_block = parse_bytes(args.plan_block_size, "--plan-block-size")
    if args.blocks < 1 or args.repeats < 1:
        raise InvalidSpec("--blocks and --repeats must be at least 1")
    from . import cuda  # torch and CUDA only from here on

    started = time.time()
    log = (lambda line: print(line, file=sys.stderr, flush=True))
    rows = cuda.qualify(sizes, methods, directions, args.blocks, args.repeats, args.host_memory, args.seed, log,
                        args.bidir_submit == "interleaved")
    meta = {
        **cuda.device_facts(),
        "measured_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "blocks_per_transfer": args.blocks,
        "repeats": args.repeats,
        "host_memory": args.host_memory,
        "bidir_submit": args.bidir_submit,
        "seconds": round(time.time() - started, 1),
    }
    doc = document(rows, meta, plan_block)
    print(format_table(rows))
    annotated = doc["annotated"]
    if annotated["gbps"] is not None:
        print(f"CPU->GPU at {annotated['block_bytes']} B blocks ({annotated['method']}): {annotated['gbps']} GB/s")
    if args.json:
        text = json.dumps(doc, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    failed = [r for r in rows if not r.ok]
    if args.annotate_node:
        from .node import ApiServer, patch_node

        patch_node(args.annotate_node, node_patch(rows, meta, plan_block), ApiServer.in_cluster())
        print(f"annotated node {args.annotate_node}")
    if args.hold:
        while True:  # the DaemonSet controller deletes this pod once the node carries the label
            time.sleep(3600)
    return 1 if failed and len(failed) == len(rows) else 0
