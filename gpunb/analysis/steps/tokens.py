"""Tokens per sample, read from a batch: the sequence length of token ids, for tokens/s and
tokens/J in a profiled cell (``instruments.py`` reads the first DataLoader batch)."""

from __future__ import annotations

from typing import Any


def first_tensor(batch: Any) -> Any:
    """The first tensor-like object (it has a ``shape``) in a batch: the batch itself, the first
    value of a dict or the first item of a list or tuple, three levels deep at most; else None."""
    for _ in range(3):
        if getattr(batch, "shape", None) is not None:
            return batch
        if isinstance(batch, dict):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, (list, tuple)) and batch:
            batch = batch[0]
        else:
            return None
    return None


def sequence_length(batch: Any) -> int | None:
    """Tokens per sample when the batch is token ids: the second dimension of a 2-D integer
    tensor (``input_ids`` first in a dict, else the first tensor found); None otherwise (images,
    feature rows and float sequences have no token count to detect)."""
    if isinstance(batch, dict) and "input_ids" in batch:
        batch = batch["input_ids"]
    tensor = first_tensor(batch)
    if tensor is None:
        return None
    shape = tensor.shape
    dtype = str(getattr(tensor, "dtype", ""))
    integer = "int" in dtype and "uint8" not in dtype  # uint8: image pixels, not token ids
    return int(shape[1]) if len(shape) == 2 and integer and int(shape[1]) > 1 else None
