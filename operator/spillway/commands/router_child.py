"""vllm-router started with arguments read from stdin: `spillway route` hands the workers' API key over a
pipe, so it is on no command line. Runs vllm-router's own Python launcher (the `vllm-router` package)."""
from __future__ import annotations

import json
import sys


def main() -> int:
    request = json.loads(sys.stdin.read())
    from vllm_router.launch_router import launch_router, parse_router_args

    router_args = parse_router_args(request["args"])
    router_args.api_key = request.get("api_key") or None
    launch_router(router_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
