"""`spillway loadtest`: prove that KV offloading pays on your hardware and model.

Experiment "ttft": a prompt's first request (recompute) against its repeat after the GPU copy was
evicted (served from the CPU pool). Experiment "throughput": unique prompts swept over target CPU hit
rates. The server's /metrics before and after each point give the hit rate it achieved. The other
experiments (prefix_groups, preemption, working_set, verify) share experiment.py's plan/run/report shape.

The HTTP part (client, metrics, runner) needs only the standard library and aiohttp; the Job mode needs
the kubernetes package and plots need matplotlib, both imported only when used.
"""
from .cli import add_parser

__all__ = ["add_parser"]
