"""The failing training cell the OOM tests run in a shell: ``train_step`` raises an
OutOfMemoryError from a frame holding its activations and an object that pins a tensor (the
test keeps a weak reference to that object in ``_gpunb_test["ref"]``, and the message in
``_gpunb_test["msg"]``)."""


def oom_cell_definitions(payload_side: int) -> str:
    """``Pinned`` (a ``payload_side``² float tensor) and ``train_step``, defined, not called."""
    return f"""
import torch, weakref
class Pinned:
    def __init__(self):
        self.payload = torch.zeros({payload_side}, {payload_side})
def train_step(bs):
    acts = torch.zeros(bs, 64)
    pinned = Pinned()
    _gpunb_test["ref"] = weakref.ref(pinned)
    raise torch.OutOfMemoryError(_gpunb_test["msg"])
"""


def failing_oom_cell(payload_side: int, batch: int) -> str:
    """The definitions, then ``train_step(batch)``: the cell fails."""
    return oom_cell_definitions(payload_side) + f"train_step({batch})\n"
