"""What the leak finder found in a profiled cell (``CellProfile.leak``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class LeakFinding:
    """One holder whose memory grew with every step."""

    holder: str  # the container's reference path: "running_preds", "model.fc1.<forward hook save>.store"
    pattern: str  # "history" | "graph" | "tensors" | "bytes" | "unnamed"
    sentence: str  # the finding: "`running_preds` holds 60 tensors with autograd history"
    fix: str  # what to write instead: "append `logits.detach()`, or `logits.item()` for a number"
    tensors: int  # held at the last look
    tensors_per_step: float
    bytes_held: int  # the held tensors' storages at the last look (their graphs' host memory not counted)
    bytes_per_step: float
    graph_nodes: int = 0
    graph_nodes_per_step: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LeakReport:
    """The leak finder's evidence and findings for one cell (findings empty: nothing grew)."""

    findings: tuple[LeakFinding, ...]
    looks: int  # censuses taken after the warm-up (the last one at the cell's end)
    steps: tuple[int, ...]  # the step (1-based) each look followed
    looks_skipped: int  # censuses left out to keep within the time budget
    cost_s: float  # time spent in the censuses
    wall_s: float  # the cell's time up to the last look
    # allocated bytes per step on the GPU after the warm-up (None: no steady GPU growth, or no GPU timeline)
    allocated_per_step: float | None = None
    note: str = ""  # why nothing could be judged ("3 steps after the warm-up: too few to judge")

    @property
    def cost_share(self) -> float:
        return self.cost_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def rate_per_step(self) -> float:
        """The growth the report leads with: the GPU's allocated bytes when they grew steadily,
        else the held bytes of every finding."""
        if self.allocated_per_step is not None:
            return self.allocated_per_step
        return sum(f.bytes_per_step for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {"findings": [f.to_dict() for f in self.findings], "looks": self.looks, "steps": list(self.steps),
                "looks_skipped": self.looks_skipped, "cost_s": self.cost_s, "wall_s": self.wall_s,
                "cost_share": self.cost_share, "allocated_per_step": self.allocated_per_step,
                "rate_per_step": self.rate_per_step, "note": self.note}
