"""Fingerprints of arrays for in-process keys: xxHash's XXH3 at 128 bits.

The planner, codegen and the emulator key their caches by the contents of per-core tables:
re-layout wants and holdings (`partition.transitions`), routed exchanges
(`partition.meshmove`, `t10c.multicast`, `emulator.timing`), equal tables (`codegen`). A
wafer's tables run to hundreds of millions of entries: the timing-only run of bert-large on
wse2 hashed 2.9 GB of them. On this project's machine BLAKE2b hashed 1.5 GB/s and XXH3 38
GB/s, so hashing was 6 s of that compile's CPU time.

The keys are never written to a file, and they are of the compiler's own tables, not of
anything an adversary chooses, so a non-cryptographic hash serves: two distinct inputs share
a 128-bit digest with probability about 2^-128. Each caller decides what goes in (raw bytes,
or values made canonical first, with or without the dtype and shape); this module only says
which hash takes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xxhash


def hasher() -> Any:
    """A fresh incremental hash (``update(buffer)``, ``digest()``: 16 bytes). ``update``
    takes any C-contiguous buffer (bytes, a contiguous numpy array) without a copy."""
    return xxhash.xxh3_128()


def digest_of(data: Any) -> bytes:
    """The 16-byte digest of one C-contiguous buffer."""
    return xxhash.xxh3_128_digest(data)


def digest_arrays(*arrays: np.ndarray | None) -> bytes:
    """The digest of arrays' raw values in row-major order, one after another (``-`` for
    None, each followed by ``|``): neither their dtypes nor their shapes go in, so a caller
    that needs them equal passes arrays of one dtype, or puts the shapes in its key."""
    h = hasher()
    for a in arrays:
        h.update(b"-" if a is None else np.ascontiguousarray(a))
        h.update(b"|")
    return h.digest()
