"""GPU side of `spillway qualify`: time scattered block copies between GPU memory and pinned host memory.

Three ways to copy (core.qualification.METHODS): vLLM's own batched op (`swap_blocks_batch`, what its offload
worker calls), one cudaMemcpyAsync per block, and one Triton copy kernel. Two kinds of host memory:
cudaHostAlloc'd ("alloc") and an mmap of /dev/shm registered with cudaHostRegister ("shm", how
vLLM >= 0.27 holds its pool). Timing: CUDA events around each transfer on non-blocking streams.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import random
from collections.abc import Callable, Iterable
from typing import Any

from ..core.errors import SpillwayError
from ..core.qualification import Row
from .measure import block_pointers, gbps, pool_blocks, scatter, transfer_bytes

CUDA_MEMCPY_DEFAULT = 4  # cudaMemcpyKind: direction inferred from the unified addresses
POISON = 0xA5
CHECK_BLOCKS = 4  # blocks compared byte for byte after each checked transfer


class NoCudaDevice(SpillwayError):
    reason = "NoCudaDevice"


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise NoCudaDevice(f"qualify measures with PyTorch, which is not importable here ({exc})") from exc
    if not torch.cuda.is_available():
        raise NoCudaDevice("no CUDA device is visible: qualify runs on a GPU node")
    return torch


def _cudart() -> ctypes.CDLL:
    """The CUDA runtime library torch loaded (falls back to the system's)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "libcudart.so" in path and os.path.exists(path):
                return ctypes.CDLL(path)
    for name in ("libcudart.so.13", "libcudart.so.12", ctypes.util.find_library("cudart")):
        if name:
            try:
                return ctypes.CDLL(name)
            except OSError:
                continue
    raise RuntimeError("libcudart not found")


def vllm_version() -> str | None:
    try:
        import vllm
    except Exception:  # noqa: BLE001 - any import failure means: not usable here
        return None
    return getattr(vllm, "__version__", "unknown")


class HostBuffer:
    """Pinned host memory: cudaHostAlloc ("alloc") or a registered /dev/shm mmap ("shm")."""

    def __init__(self, torch, nbytes: int, kind: str, shm_dir: str = "/dev/shm"):
        self.kind, self.nbytes, self._mmap, self._path = kind, nbytes, None, None
        if kind == "alloc":
            self.tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        elif kind == "shm":
            self._path = os.path.join(shm_dir, f"spillway_qualify_{os.getpid()}.mmap")
            fd = os.open(self._path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.ftruncate(fd, nbytes)
                self._mmap = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
            self.tensor = torch.frombuffer(self._mmap, dtype=torch.uint8)
            rc = torch.cuda.cudart().cudaHostRegister(self.tensor.data_ptr(), nbytes, 0)
            if int(getattr(rc, "value", rc)) != 0:
                self.close(torch, registered=False)
                raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed ({rc})")
        else:
            raise ValueError(f"unknown host memory kind {kind!r}")

    def close(self, torch, registered: bool = True) -> None:
        if self.kind == "shm" and self._mmap is not None:
            if registered:
                torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
            del self.tensor
            try:
                self._mmap.close()
            except BufferError:  # a view is still alive somewhere; the mapping goes with the process
                pass
            self._mmap = None
            os.unlink(self._path)


class Qualifier:
    """Holds one GPU pool and one host pool big enough for every block size asked for."""

    def __init__(self, device_bytes: int, host_bytes: int, host_kind: str = "alloc", seed: int = 0,
                 interleave_bidir: bool = True):
        torch = self.torch = _torch()
        self.interleave_bidir = interleave_bidir  # dma: alternate the two directions' cudaMemcpyAsync calls
        self.rng = random.Random(seed)
        self.gpu = torch.empty(device_bytes, dtype=torch.uint8, device="cuda")
        self.gpu.random_(0, 256)  # never time on zeros
        self.host = HostBuffer(torch, host_bytes, host_kind)
        step = 1 << 30
        for i in range(0, host_bytes, step):  # random content on the host side too
            j = min(host_bytes, i + step)
            k = min(j - i, device_bytes)
            self.host.tensor[i:i + k].copy_(self.gpu[:k])
        torch.cuda.synchronize()
        self.streams = (torch.cuda.Stream(), torch.cuda.Stream())
        self._memcpy = None
        self._vllm_ops = None
        self._kernel = None

    def close(self) -> None:
        self.torch.cuda.synchronize()
        self.host.close(self.torch)

    # -- the three methods: each enqueues `len(src)` copies of `block_bytes` on `stream` --------
    def available_methods(self, wanted: Iterable[str]) -> dict[str, str | None]:
        """method -> None when usable, else the reason it is not."""
        out: dict[str, str | None] = {}
        for m in wanted:
            try:
                self._method(m)
                out[m] = None
            except Exception as exc:  # noqa: BLE001 - report why, measure the rest
                out[m] = f"{type(exc).__name__}: {exc}"
        return out

    def _method(self, name: str) -> Callable[..., None]:
        """The enqueue function of a method: fn(*prepared_args, block_bytes, stream, to_gpu)."""
        if name == "dma":
            if self._memcpy is None:
                fn = _cudart().cudaMemcpyAsync
                fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
                fn.restype = ctypes.c_int
                self._memcpy = fn
            return self._dma
        if name == "vllm":
            if self._vllm_ops is None:
                from vllm import _custom_ops as ops

                if not hasattr(ops, "swap_blocks_batch"):
                    raise RuntimeError("this vLLM has no swap_blocks_batch op")
                self._vllm_ops = ops
            return self._vllm
        if name == "kernel":
            if self._kernel is None:
                from .copy_kernel import copy_blocks

                self._kernel = copy_blocks
            return self._triton
        raise ValueError(f"unknown method {name!r}")

    def _dma(self, src: list[int], dst: list[int], block_bytes: int, stream, to_gpu: bool) -> None:
        fn, handle = self._memcpy, ctypes.c_void_p(stream.cuda_stream)
        failed = 0
        for s, d in zip(src, dst):
            failed |= fn(d, s, block_bytes, CUDA_MEMCPY_DEFAULT, handle)
        if failed:
            raise RuntimeError(f"cudaMemcpyAsync failed (error bits {failed})")

    def _ptr_tensors(self, src: list[int], dst: list[int], device: str = "cpu"):
        torch = self.torch
        pin = device == "cpu"
        s = torch.tensor(src, dtype=torch.int64).pin_memory() if pin else torch.tensor(src, dtype=torch.int64)
        d = torch.tensor(dst, dtype=torch.int64).pin_memory() if pin else torch.tensor(dst, dtype=torch.int64)
        return s, d

    def _vllm(self, src, dst, sizes, block_bytes, stream, to_gpu) -> None:
        s, d, torch = src, dst, self.torch
        with torch.cuda.stream(stream):
            try:
                self._vllm_ops.swap_blocks_batch(s, d, sizes, is_src_access_order_any=to_gpu)
            except TypeError:  # older vLLM: no access-order argument
                self._vllm_ops.swap_blocks_batch(s, d, sizes)

    def _triton(self, src, dst, block_bytes, stream, to_gpu) -> None:
        with self.torch.cuda.stream(stream):
            self._kernel(src, dst, block_bytes)

    def _prepare(self, method: str, src: list[int], dst: list[int], block_bytes: int) -> tuple:
        """Argument form each method takes; built before the timed region."""
        if method == "dma":
            return src, dst
        if method == "vllm":
            sizes = self.torch.full((len(src),), block_bytes, dtype=self.torch.int64).pin_memory()
            return (*self._ptr_tensors(src, dst), sizes)
        s, d = self._ptr_tensors(src, dst)
        return s.to("cuda", non_blocking=True), d.to("cuda", non_blocking=True)

    # -- one transfer ---------------------------------------------------------------------------
    def _pairs(self, direction: str, block_bytes: int, blocks: int) -> dict[str, tuple[list[int], list[int]]]:
        pool = pool_blocks(block_bytes, blocks)
        gpu, host = self.gpu.data_ptr(), self.host.tensor.data_ptr()
        out = {}
        if direction in ("g2c", "bidir"):
            out["g2c"] = (block_pointers(gpu, scatter(self.rng, pool, blocks), block_bytes),
                          block_pointers(host, scatter(self.rng, pool, blocks), block_bytes))
        if direction in ("c2g", "bidir"):
            out["c2g"] = (block_pointers(host, scatter(self.rng, pool, blocks), block_bytes),
                          block_pointers(gpu, scatter(self.rng, pool, blocks), block_bytes))
        return out

    def transfer(self, method: str, direction: str, block_bytes: int, blocks: int, check: bool = False) -> float:
        """Time one transfer; returns seconds. With check, poison a few destinations and compare after."""
        torch = self.torch
        run = self._method(method)
        pairs = self._pairs(direction, block_bytes, blocks)
        args = {k: self._prepare(method, *v, block_bytes) for k, v in pairs.items()}
        samples = self._poison(pairs, block_bytes) if check else []
        main, other = self.streams
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        main.wait_stream(torch.cuda.current_stream())
        other.wait_stream(torch.cuda.current_stream())
        start.record(main)
        if direction == "bidir":
            other.wait_event(start)
            if method == "dma" and self.interleave_bidir:  # alternate the two directions' submissions
                self._dma_interleaved(args, block_bytes, main, other)
            else:
                run(*args["g2c"], block_bytes, main, False)
                run(*args["c2g"], block_bytes, other, True)
            main.wait_stream(other)
        else:
            run(*args[direction], block_bytes, main, direction == "c2g")
        end.record(main)
        end.synchronize()
        err = torch.cuda.cudart().cudaGetLastError() if hasattr(torch.cuda.cudart(), "cudaGetLastError") else 0
        if int(getattr(err, "value", err)):
            raise RuntimeError(f"CUDA error {err} after {method} {direction}")
        if check:
            self._compare(samples, block_bytes)
        return start.elapsed_time(end) / 1e3

    def _dma_interleaved(self, args, block_bytes, s_g2c, s_c2g) -> None:
        fn = self._memcpy
        h1, h2 = ctypes.c_void_p(s_g2c.cuda_stream), ctypes.c_void_p(s_c2g.cuda_stream)
        (gs, gd), (cs, cd) = args["g2c"], args["c2g"]
        failed = 0
        for a, b, c, d in zip(gs, gd, cs, cd):
            failed |= fn(b, a, block_bytes, CUDA_MEMCPY_DEFAULT, h1)
            failed |= fn(d, c, block_bytes, CUDA_MEMCPY_DEFAULT, h2)
        if failed:
            raise RuntimeError(f"cudaMemcpyAsync failed (error bits {failed})")

    def _view(self, ptr: int, block_bytes: int):
        for buf in (self.gpu, self.host.tensor):
            base = buf.data_ptr()
            if base <= ptr < base + buf.numel():
                return buf[ptr - base: ptr - base + block_bytes]
        raise ValueError("pointer outside both pools")

    def _poison(self, pairs, block_bytes: int) -> list[tuple[int, int]]:
        picked = []
        for src, dst in pairs.values():
            for i in self.rng.sample(range(len(src)), min(CHECK_BLOCKS, len(src))):
                self._view(dst[i], block_bytes).fill_(POISON)
                picked.append((src[i], dst[i]))
        self.torch.cuda.synchronize()
        return picked

    def _compare(self, picked: list[tuple[int, int]], block_bytes: int) -> None:
        for s, d in picked:
            a = self._view(s, block_bytes).to("cuda")
            b = self._view(d, block_bytes).to("cuda")
            if not self.torch.equal(a, b):
                raise RuntimeError("copied block differs from its source")


def qualify(block_sizes: list[int], methods: list[str], directions: list[str], blocks: int, repeats: int,
            host_kind: str = "alloc", seed: int = 0, progress: Callable[[str], None] = lambda _: None,
            interleave_bidir: bool = True) -> list[Row]:
    """Measure every (method, direction, block size); a method that cannot run yields rows with its error."""
    from .measure import pool_bytes

    size = pool_bytes(block_sizes, blocks)
    q = Qualifier(size, size, host_kind, seed, interleave_bidir)
    rows: list[Row] = []
    try:
        usable = q.available_methods(methods)
        for block_bytes in block_sizes:
            for method in methods:
                for direction in directions:
                    row = Row(method, direction, block_bytes, blocks, host_kind)
                    rows.append(row)
                    if usable[method]:
                        row.error = usable[method]
                        continue
                    try:
                        q.transfer(method, direction, block_bytes, blocks, check=direction != "bidir")  # warm-up
                        for _ in range(repeats):
                            seconds = q.transfer(method, direction, block_bytes, blocks)
                            row.samples.append(gbps(transfer_bytes(block_bytes, blocks, direction), seconds))
                    except Exception as exc:  # noqa: BLE001 - one bad cell must not hide the others
                        row.error = f"{type(exc).__name__}: {exc}"
                    progress(f"{method:6s} {direction:5s} {block_bytes:>9d} B  "
                             + (f"{row.median:6.1f} GB/s" if row.ok else str(row.error)))
    finally:
        q.close()
    return rows


def device_facts() -> dict[str, Any]:
    torch = _torch()
    props = torch.cuda.get_device_properties(0)
    facts: dict[str, Any] = {"gpu": props.name, "torch": torch.__version__, "cuda": torch.version.cuda}
    version = vllm_version()
    if version:
        facts["vllm"] = version
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        facts["driver"] = pynvml.nvmlSystemGetDriverVersion()
        facts["pcie"] = {"gen": pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
                         "width": pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)}
    except Exception as exc:  # noqa: BLE001 - NVML is optional detail
        facts["nvml"] = f"unavailable: {exc}"
    return facts
