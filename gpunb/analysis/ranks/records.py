"""The records of a profiled multi-GPU cell: each worker process's measurements (a *rank*)
and what they say together. Filled by :mod:`gpunb.analysis.ranks.summary`, shown by
:mod:`gpunb.views.ranks_view`, carried in ``CellProfile.ranks``."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpunb.display import DisplayMixin


@dataclass(frozen=True)
class DdpTiming:
    """DDP's own timing (``_get_ddp_logging_data()``) in milliseconds: the mean over the
    iterations it sampled (1-10, then every 100th), the first left out."""

    iteration: int  # the latest sampled
    forward_ms: float | None = None
    backward_compute_ms: float | None = None
    backward_comm_ms: float | None = None  # the gradient all-reduce, from its start to its end
    overlap_ms: float | None = None  # the part of it that ran while the backward still computed
    iterations: tuple[int, ...] = ()

    @property
    def sampled(self) -> str:
        """Which iterations the figures are of, in words."""
        its = self.iterations or (self.iteration,)
        if len(its) == 1:
            return f"iteration {its[0]}"
        return f"{len(its)} sampled iterations ({its[0]}-{its[-1]})"

    @property
    def exposed_comm_ms(self) -> float | None:
        """All-reduce time nothing else hid: what communication added to the step."""
        if self.backward_comm_ms is None:
            return None
        return max(0.0, self.backward_comm_ms - (self.overlap_ms or 0.0))


@dataclass(frozen=True)
class RankStats:
    """One worker process of the cell."""

    rank: int | None  # torch.distributed's rank (or RANK from the launcher); None: unknown
    pid: int
    launcher: str  # "fork" or "fresh interpreter"
    device: int | None  # the cuda:N it trained on; None: CPU
    nvml_index: int | None
    gpu_name: str
    steps: int
    first_ms: float | None
    median_ms: float | None  # warm-up steps left out
    p90_ms: float | None
    source: str  # "CUDA events" or "host clock"
    data_wait_s: float
    batches: int
    batch_size: int | None
    loop_s: float | None  # first batch (or start) to last step
    peak_allocated_bytes: int | None  # the rank's allocator since it started
    peak_reserved_bytes: int | None
    nvml_peak_bytes: int | None  # the process as NVML listed it (context, NCCL, cuDNN too)
    total_bytes: int | None
    ddp: DdpTiming | None
    backend: str | None
    finished: bool  # False: the process had not exited when the cell ended (or was killed)

    @property
    def name(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"

    @property
    def data_share(self) -> float | None:
        return self.data_wait_s / self.loop_s if self.loop_s else None


@dataclass(frozen=True)
class RanksPart(DisplayMixin):
    """Every rank of the cell, the slowest named, and how the ranks' GPUs are joined."""

    ranks: tuple[RankStats, ...]
    world_size: int | None
    slowest: int | None  # index into ``ranks``
    fastest: int | None
    spread: float | None  # what the slowest costs the others, as a share of a step (see ``slowest_by``)
    slowest_by: str = ""  # "all-reduce wait" (DDP's timing) or "median step" (no DDP timing)
    wait_ms: float | None = None  # with DDP: how long the others wait for the slowest at each all-reduce
    balanced: bool = True  # the difference is within timing noise: no rank is named the slowest
    link: str = ""  # "NVLink × 18 through NVSwitch", "PCIe (NODE), no peer access", ...
    link_is_pcie: bool = False
    nvlink_traffic: dict[int, int] = field(default_factory=dict)  # NVML index -> bytes sent+received during the cell
    notes: tuple[str, ...] = ()
