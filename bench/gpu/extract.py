#!/usr/bin/env python3
"""Unpack the tar.xz archives made by pack_v026.sh into /tmp/site (on the GPU machine)."""
import sys
import tarfile
import time

for p in sys.argv[1:]:
    t = time.time()
    with tarfile.open(p) as tf:
        tf.extractall("/tmp/site")
    print(f"extracted {p} in {time.time()-t:.1f}s")
