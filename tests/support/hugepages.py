"""2 MiB huge pages reserved for one test (vm.nr_hugepages), across pytest workers."""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from support.tools import skip_or_fail

NR_HUGEPAGES = Path("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
LOCK = Path("/tmp/spillway-hugepages.lock")


@contextlib.contextmanager
def reserved(pages: int) -> Iterator[int]:
    """`pages` more 2 MiB pages in the machine's pool while the block runs, the old count put back after. One test
    at a time holds them (a lock file across processes): two workers' raise and restore would interleave, and one
    would put the count back under the other's pages before it took them."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or not NR_HUGEPAGES.exists():
        skip_or_fail("needs root, unshare and 2 MiB huge pages (a hugetlbfs mount in a private mount namespace, "
                     "vm.nr_hugepages)")
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = int(NR_HUGEPAGES.read_text())
        NR_HUGEPAGES.write_text(str(old + pages))
        try:
            given = int(NR_HUGEPAGES.read_text()) - old
            if given < pages:
                skip_or_fail(f"the kernel gave {given} of {pages} huge pages")
            yield pages
        finally:
            NR_HUGEPAGES.write_text(str(old))
