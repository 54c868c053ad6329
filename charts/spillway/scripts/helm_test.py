"""`helm test` check: the operator answers its health endpoint; each model serves /v1/models and /metrics.

Usage: python helm_test.py --operator URL [--model NAME=BASE_URL ...] [--timeout SECONDS]
Each check is retried until the deadline (a model may still be loading); exit 1 when any fails.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

from spillway.core.vllm_api import METRICS_PATH, MODELS_PATH, Metric


class CheckFailed(Exception):
    pass


def fetch(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        raise CheckFailed(f"GET {url}: {exc}") from exc


def check_operator(url: str) -> str:
    fetch(url)
    return "healthy"


def check_model(base_url: str) -> str:
    try:
        served = [entry["id"] for entry in json.loads(fetch(base_url + MODELS_PATH))["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckFailed(f"{base_url}{MODELS_PATH}: not an OpenAI model list ({exc})") from exc
    if not served:
        raise CheckFailed(f"{base_url}{MODELS_PATH}: serves no model")
    metrics = fetch(base_url + METRICS_PATH)
    gauge = Metric.REQUESTS_RUNNING
    if not any(line.startswith((gauge + "{", gauge + " ")) for line in metrics.splitlines()):
        raise CheckFailed(f"{base_url}{METRICS_PATH}: no {gauge} sample")
    return f"serves {', '.join(served)}; metrics ok"


def run_until(deadline: float, check, *args) -> str:
    while True:
        try:
            return check(*args)
        except CheckFailed:
            if time.monotonic() >= deadline:
                raise
            time.sleep(5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--operator", required=True, help="the operator's health URL")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=BASE_URL")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for all checks")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    checks = [("operator", check_operator, args.operator)]
    for item in args.model:
        name, _, base_url = item.partition("=")
        checks.append((f"model {name}", check_model, base_url.rstrip("/")))
    failed = 0
    for label, check, target in checks:
        try:
            print(f"ok   {label}: {run_until(deadline, check, target)}", flush=True)
        except CheckFailed as exc:
            print(f"FAIL {label}: {exc}", flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
