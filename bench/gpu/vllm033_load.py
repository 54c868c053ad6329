#!/usr/bin/env python3
"""Does vLLM 0.33's main extension load on this machine's torch? (its wheel pins torch 2.14.0)

Loads vllm/_C_stable_libtorch.abi3.so of the 0.33.0 wheel (unpacked under the folder given) with
torch.ops.load_library, prints the exact outcome, and lists the torch symbols the extension needs that
this torch's libraries do not export.

    python3 bench/gpu/vllm033_load.py /tmp/v33
"""
import ctypes
import json
import os
import subprocess
import sys

import torch

root = sys.argv[1]
so = os.path.join(root, "vllm", "_C_stable_libtorch.abi3.so")
out = {"torch": torch.__version__, "extension": so, "size": os.path.getsize(so)}
try:
    torch.ops.load_library(so)
    out["load"] = "ok"
except Exception as exc:  # noqa: BLE001 - the exact error is the result
    out["load"] = f"{type(exc).__name__}: {exc}"
nm = subprocess.run(["nm", "-D", "--undefined-only", so], capture_output=True, text=True, check=False)
needed = [line.split()[-1] for line in nm.stdout.splitlines() if line.strip()]
libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
libs = [ctypes.CDLL(os.path.join(libdir, name)) for name in ("libtorch.so", "libtorch_cpu.so", "libtorch_cuda.so", "libc10.so")
        if os.path.exists(os.path.join(libdir, name))]
torch_syms = [s for s in needed if s.startswith(("aoti_", "torch_", "_ZN3c10", "_ZN2at", "_ZN5torch"))]
missing = [s for s in torch_syms if not any(hasattr(lib, s) for lib in libs)]
out.update(torch_symbols_needed=len(torch_syms), missing=missing)
print("VLLM033 " + json.dumps(out))
