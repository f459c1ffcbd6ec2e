"""Tokens per sample, read from a batch: the sequence length of token ids, for tokens/s and
tokens/J in a profiled cell (``instruments.py`` reads the first DataLoader batch)."""

from __future__ import annotations

from typing import Any


def sequence_length(batch: Any) -> int | None:
    """Tokens per sample when the batch is token ids: the second dimension of a 2-D integer
    tensor (``input_ids`` first in a dict, else the first tensor found); None otherwise (images,
    feature rows and float sequences have no token count to detect)."""
    if isinstance(batch, dict) and "input_ids" in batch:
        batch = batch["input_ids"]
    for _ in range(3):
        shape = getattr(batch, "shape", None)
        if shape is not None:
            dtype = str(getattr(batch, "dtype", ""))
            integer = "int" in dtype and "uint8" not in dtype  # uint8: image pixels, not token ids
            return int(shape[1]) if len(shape) == 2 and integer and int(shape[1]) > 1 else None
        if isinstance(batch, dict):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, (list, tuple)) and batch:
            batch = batch[0]
        else:
            return None
    return None
