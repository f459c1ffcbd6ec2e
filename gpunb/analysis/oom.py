"""The OOM doctor: why a CUDA allocation failed, and what to change.

Inputs are readings, never guesses: the numbers in torch's message, the allocator's
statistics, NVML's per-process memory (this kernel vs other processes) and the census of
live tensors. Causes are named from those; fixes carry an estimated saving for this case.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from gpunb import units
from gpunb.analysis.advice import Advice, ranked
from gpunb.analysis.oom_message import OomMessage, find_oom, parse_oom_message
from gpunb.analysis.tensor_census import EXCEPTION, NAMESPACE, Census, take_census
from gpunb.readings.torch_memory import TorchDeviceMemory

GiB = 2**30
CUDA_NOTES = "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"

# Cause identifiers (stable: tests and the GPU measurements key on them).
TOO_LARGE_FOR_GPU = "request-exceeds-gpu"
OTHER_PROCESSES = "other-processes"
LEFTOVERS = "leftovers"
FRAGMENTATION = "fragmentation"
WORKING_SET = "working-set"  # the cell itself needs more than is free: batch/activations


@dataclass(frozen=True)
class Cause:
    code: str
    summary: str  # one line, with the numbers
    bytes: int | None = None  # how much memory this cause accounts for

    def to_dict(self) -> dict:
        return {"code": self.code, "summary": self.summary, "bytes": self.bytes}


@dataclass(frozen=True)
class OtherProcess:
    pid: int
    used_bytes: int | None
    name: str = ""

    def to_dict(self) -> dict:
        return {"pid": self.pid, "used_bytes": self.used_bytes, "name": self.name}


@dataclass
class OomDiagnosis:
    """What one OOM was, why, what to change; and (after release) what came back."""

    exception_type: str
    message: OomMessage | None
    causes: list[Cause]
    fixes: list[Advice]
    census: Census | None = None
    torch_memory: TorchDeviceMemory | None = None
    other_processes: tuple[OtherProcess, ...] = ()
    this_process_bytes: int | None = None  # NVML
    release: Any = None  # ReleaseReport, filled by the shell hook
    notes: list[str] = field(default_factory=list)

    @property
    def primary_cause(self) -> str | None:
        return self.causes[0].code if self.causes else None

    def to_dict(self) -> dict:
        return {
            "exception_type": self.exception_type,
            "message": self.message.to_dict() if self.message else None,
            "causes": [c.to_dict() for c in self.causes],
            "fixes": [f.to_dict() for f in self.fixes],
            "census": self.census.to_dict() if self.census else None,
            "torch_memory": self.torch_memory.to_dict() if self.torch_memory else None,
            "other_processes": [p.to_dict() for p in self.other_processes],
            "this_process_bytes": self.this_process_bytes,
            "release": self.release.to_dict() if self.release is not None else None,
            "notes": list(self.notes),
        }

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        from gpunb.views.memory_view import diagnosis_html, diagnosis_text

        return {"text/plain": diagnosis_text(self), "text/html": diagnosis_html(self)}

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        from gpunb.views.memory_view import diagnosis_text

        p.text(diagnosis_text(self))


def gib(n: int | None) -> str:
    return units.gib(n, digits=2)


def _frac(part: int | None, whole: int | None) -> float | None:
    if part is None or not whole:
        return None
    return max(0.0, min(1.0, part / whole))


def diagnose(
    exc: BaseException | None = None,
    *,
    message: str | None = None,
    torch_memory: TorchDeviceMemory | None = None,
    census: Census | None = None,
    other_processes: tuple[OtherProcess, ...] = (),
    this_process_bytes: int | None = None,
    allocator_conf: str | None = None,
    batch_size: tuple[str, int] | None = None,
) -> OomDiagnosis:
    """Diagnose from readings (all optional except the exception or its message).

    ``census`` should name the live tensors (namespace and the failed cell's frames,
    source ``EXCEPTION`` or another label that is not the namespace/output history).
    """
    oom = find_oom(exc) if exc is not None else None
    text = message if message is not None else (str(oom) if oom is not None else str(exc or ""))
    msg = parse_oom_message(text)
    etype = type(oom or exc).__name__ if (oom or exc) is not None else "OutOfMemoryError"
    if allocator_conf is None:
        allocator_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF", ""))
    expandable_on = "expandable_segments:true" in allocator_conf.replace(" ", "").lower()

    m = msg or OomMessage(kind="cuda", text=text)
    requested = m.requested_bytes
    total = m.total_bytes or (torch_memory.total_bytes if torch_memory else None)
    free = m.free_bytes if m.free_bytes is not None else (torch_memory.free_bytes if torch_memory else None)
    unalloc = m.reserved_unallocated_bytes
    if unalloc is None and torch_memory is not None:
        unalloc = torch_memory.reserved_unallocated_bytes
    allocated = m.allocated_bytes if m.allocated_bytes is not None else (
        torch_memory.allocated_bytes if torch_memory else None)
    process = m.process_bytes if m.process_bytes is not None else this_process_bytes
    allowed = m.allowed_bytes
    device_free = free
    headroom = None
    if allowed is not None and allocated is not None:  # under set_per_process_memory_fraction
        headroom = max(0, allowed - allocated - (unalloc or 0))
        free = headroom if free is None else min(free, headroom)

    others = list(other_processes)
    if not others and m.other_processes:
        others = [OtherProcess(pid, used) for pid, used in m.other_processes]
        if m.process_bytes is None and allocated is not None:  # PIDs seen from a container: find ourselves
            me = own_process(others, allocated + (unalloc or 0))
            if me is not None:
                others.remove(me)
                process = me.used_bytes
    other_bytes = sum(p.used_bytes or 0 for p in others)

    by_role = census.by_role() if census else {}
    params = by_role.get("parameter", 0)
    grads = by_role.get("gradient", 0)
    opt_state = by_role.get("optimizer state", 0)
    leftover_entries = [e for e in census.entries if e.source != NAMESPACE and e.source != EXCEPTION] if census else []
    # Leftovers: not the model/optimizer, and not the failed cell's frames — tensors kept
    # from earlier cells (namespace "other" that predates the failing cell is passed by the
    # hook as source "earlier cells"), the output history and older exceptions.
    leftover_bytes = sum(e.nbytes for e in leftover_entries)
    frames_bytes = census.total_bytes(source=EXCEPTION) if census else 0

    # What the failing code needed at that moment (lower bound): what torch held plus the request.
    needed = (allocated or 0) + (requested or 0) if allocated is not None and requested is not None else None
    limit = allowed or total

    causes: list[Cause] = []
    if requested is not None and limit is not None and requested > limit:
        causes.append(Cause(TOO_LARGE_FOR_GPU,
                            f"one allocation of {gib(requested)} is larger than the whole "
                            f"{'allowed budget' if allowed else 'GPU'} ({gib(limit)}): no freeing can make it fit",
                            requested))
    if total and other_bytes > 0.05 * total:
        names = ", ".join(f"PID {p.pid}{' (' + p.name + ')' if p.name else ''}: {gib(p.used_bytes)}" for p in others[:4])
        causes.append(Cause(OTHER_PROCESSES, f"other processes hold {gib(other_bytes)} of this GPU ({names})",
                            other_bytes))
    if leftover_bytes and (  # before fragmentation: freeing needs no code change
        (requested is not None and leftover_bytes >= 0.5 * requested) or (total and leftover_bytes > 0.05 * total)
    ):
        top = ", ".join(f"{e.name} ({gib(e.nbytes)})" for e in leftover_entries[:3])
        causes.append(Cause(LEFTOVERS, f"{gib(leftover_bytes)} is held by leftovers from earlier cells: {top}",
                            leftover_bytes))
    fragmented = (unalloc is not None and requested is not None and unalloc >= requested
                  and not expandable_on) or (unalloc is not None and total and unalloc > 0.10 * total)
    if fragmented:
        causes.append(Cause(FRAGMENTATION,
                            f"PyTorch had {gib(unalloc)} reserved but unallocated (cached in pieces) when "
                            f"{gib(requested)} was asked: the memory was there, but not in one block",
                            unalloc))
    def returned(extra: int, counts_against_cap: bool = True) -> int | None:
        """How much more the request could have had if ``extra`` bytes were given back. Other
        processes' memory does not count against a per-process cap: under one, freeing them
        helps only while the device, not the cap, is the limit."""
        if free is None:
            return None
        avail = (device_free if device_free is not None else free) + extra
        if headroom is not None:
            avail = min(avail, headroom + (extra if counts_against_cap else 0))
        return max(0, avail - free)

    gives = {c.code: returned(c.bytes or 0, c.code != OTHER_PROCESSES) for c in causes}
    if not any(c.code == TOO_LARGE_FOR_GPU for c in causes):
        working = None if allocated is None else max(0, allocated - params - grads - opt_state - leftover_bytes)
        summary = "the cell's own working set (activations of this batch, temporaries) did not fit"
        if working is not None and census is not None:
            summary += (f": {gib(working)} in activations/temporaries on top of {gib(params)} parameters, "
                        f"{gib(grads)} gradients, {gib(opt_state)} optimizer state")
        if requested is not None and free is not None:
            summary += f"; asked {gib(requested)} with {gib(free)} free"
        causes.append(Cause(WORKING_SET, summary, working))
    sufficient = {code: None if g is None or requested is None else free + g >= requested for code, g in gives.items()}
    causes = _ranked_causes(causes, sufficient)

    fixes = _fixes(causes, needed=needed, requested=requested, free=free, unalloc=unalloc, params=params, grads=grads,
                   opt_state=opt_state, allocated=allocated, leftover_entries=leftover_entries, census=census,
                   others=others, expandable_on=expandable_on, batch_size=batch_size, gives=gives,
                   sufficient=sufficient)
    notes = []
    if census is not None and census.skipped_count:
        notes.append(census.skipped_note())
    if frames_bytes:
        notes.append(f"the failed cell's frames hold {gib(frames_bytes)} of tensors until released")
    if process is not None and m.non_torch_bytes is not None:
        notes.append(f"CUDA context and non-PyTorch libraries: {gib(m.non_torch_bytes)}")
    return OomDiagnosis(etype, msg, causes, fixes, census, torch_memory, tuple(others), process, None, notes)


def _ranked_causes(causes: list[Cause], sufficient: dict[str, bool | None]) -> list[Cause]:
    """First a request no freeing can satisfy; then the causes whose memory alone, given back, would
    have let the request fit (largest first); then those we cannot tell about (in the order found);
    then the cell's own working set (a smaller batch always helps); last, causes too small to
    suffice alone (largest first): they are real, but removing them would not have been enough."""
    def key(ic: tuple[int, Cause]) -> tuple:
        i, c = ic
        if c.code == TOO_LARGE_FOR_GPU:
            return (0, 0, i)
        if c.code == WORKING_SET:
            return (3, 0, i)
        ok = sufficient.get(c.code)
        size = -(c.bytes or 0)
        return (1, size, i) if ok else (2, 0, i) if ok is None else (4, size, i)

    return [c for _, c in sorted(enumerate(causes), key=key)]


def _fixes(causes: list[Cause], *, needed: int | None, requested: int | None, free: int | None,
           unalloc: int | None, params: int, grads: int, opt_state: int, allocated: int | None,
           leftover_entries: list, census: Census | None, others: list[OtherProcess],
           expandable_on: bool, batch_size: tuple[str, int] | None = None,
           gives: dict[str, int | None] | None = None, sufficient: dict[str, bool | None] | None = None,
           ) -> list[Advice]:
    codes = {c.code for c in causes}
    out: list[Advice] = []
    gain = lambda b: _frac(b, needed)  # noqa: E731  fraction of what the failing code needed
    gives, sufficient = gives or {}, sufficient or {}

    def freeing(code: str, nbytes: int | None) -> tuple[float | None, int]:
        """(gain, severity) of giving a cause's memory back: it fixes the failure only if it suffices,
        and it gains only what the request could have used (nothing, for other processes under a cap)."""
        g = gives.get(code)
        return gain(nbytes if g is None else g), 1 if sufficient.get(code) is False else 2
    if TOO_LARGE_FOR_GPU in codes:
        out.append(Advice(
            "Split the operation that asked for one huge block",
            f"a single allocation of {gib(requested)} exceeds the GPU; look at the line in the traceback",
            "Process the tensor in chunks (e.g. `torch.split` / a loop over the batch), or reduce the "
            "sequence length/resolution that sets its size.",
            None, severity=2))
    if LEFTOVERS in codes:
        names = [e.name for e in leftover_entries if not e.name.startswith(("Out[", "_"))][:5]
        outs = [e.name for e in leftover_entries if e.name.startswith("Out[")][:5]
        how = []
        if names:
            how.append("%gpumem --free " + " ".join(n.split(".")[0].split("[")[0] for n in names))
        if outs:
            how.append("%reset -f out   # output history holds: " + ", ".join(outs))
        freed = sum(e.nbytes for e in leftover_entries)
        g, sev = freeing(LEFTOVERS, freed)
        out.append(Advice("Free leftovers from earlier cells", f"{gib(freed)} held by " + ", ".join(
            e.name for e in leftover_entries[:4]), "\n".join(how) or "del <name>; then %gpumem", g, severity=sev))
    if OTHER_PROCESSES in codes:
        other = sum(p.used_bytes or 0 for p in others)
        pids = ", ".join(str(p.pid) for p in others[:5])
        g, sev = freeing(OTHER_PROCESSES, other)
        short = "" if sev == 2 else " (freeing them alone would not have been enough)"
        out.append(Advice("Free the GPU from other processes",
                          f"{gib(other)} held by PID {pids} (another kernel or job){short}",
                          "Shut down idle kernels (JupyterLab: Running tab) or use another GPU "
                          "(`CUDA_VISIBLE_DEVICES`); `nvidia-smi` lists them.", g, severity=sev))
    if FRAGMENTATION in codes and not expandable_on:
        g, sev = freeing(FRAGMENTATION, unalloc)
        out.append(Advice("Turn on expandable segments",
                          f"{gib(unalloc)} was reserved but unallocated: fragmentation",
                          "import os; os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'  "
                          "# before torch first uses CUDA: restart the kernel, set it in the first cell",
                          g, CUDA_NOTES, severity=sev))
    if WORKING_SET in codes or LEFTOVERS in codes or FRAGMENTATION in codes:
        working = next((c.bytes for c in causes if c.code == WORKING_SET), None)
        if working is None and allocated is not None:
            working = max(0, allocated - params - grads - opt_state)
        # What fits: the working set scales with the batch; the fixed part does not.
        if working and requested is not None and free is not None and needed:
            short = max(0, requested - free)
            act_need = working + requested
            fit = max(0.0, 1.0 - short / act_need) if act_need else None
            reason = (f"activations/temporaries need ≈{gib(act_need)} and {gib(short)} was missing; "
                      f"at most ≈{fit * 100:.0f} % of the current batch fits (the rest of the step allocates more)"
                      if fit is not None else "")
            factor = max(0.05, (fit or 0.5) * 0.9)  # 10 % under the estimate: the fit is approximate
            how = "batch_size = int(batch_size * %.2f)   # or find it exactly: %%gpufit step_fn" % factor
            if batch_size is not None:
                where, value = batch_size
                how = (f"batch_size = {max(1, int(value * factor))}   # {where} was {value}; "
                       "or find it exactly: %gpufit step_fn")
                reason += f" (≈{max(1, int(value * (fit or 0.5)))} of {value})"
            out.append(Advice("Use a smaller batch", reason, how,
                              _frac(short, needed) if short else 0.5 * (gain(working) or 0),
                              # the sure fix when nothing that could be freed would have been enough
                              severity=2 if causes[0].code == WORKING_SET else 1))
            out.append(Advice("Keep the effective batch with gradient accumulation",
                              "a smaller micro-batch with accumulation uses the smaller batch's memory "
                              "and trains like the large one",
                              "loss = loss / accum_steps; loss.backward()\n"
                              "if (i + 1) % accum_steps == 0: optimizer.step(); optimizer.zero_grad(set_to_none=True)",
                              _frac(short, needed) if short else None, severity=1))
            fp32_params = census is not None and any(e.role == "parameter" and e.dtype == "float32"
                                                     for e in census.entries)
            if fp32_params or census is None:
                out.append(Advice("Train in bf16 autocast",
                                  "activations stored in bf16 take half the bytes of fp32",
                                  "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = model(x)...",
                                  gain(act_need // 2), "https://docs.pytorch.org/docs/stable/amp.html"))
            out.append(Advice("Use activation checkpointing",
                              "recompute activations in backward instead of storing them (≈ +30 % compute)",
                              "from torch.utils.checkpoint import checkpoint\n"
                              "h = checkpoint(block, h, use_reentrant=False)",
                              gain(int(act_need * 0.6)),
                              "https://docs.pytorch.org/docs/stable/checkpoint.html"))
    if grads:
        out.append(Advice("Drop gradients between steps (set_to_none)",
                          f"{gib(grads)} of gradients were alive during the failing step",
                          "optimizer.zero_grad(set_to_none=True)   # or model.zero_grad(set_to_none=True) before eval",
                          gain(grads)))
    if opt_state:
        out.append(Advice("Use a lighter optimizer",
                          f"optimizer state holds {gib(opt_state)} (Adam keeps 2 values per parameter)",
                          "torch.optim.SGD(model.parameters(), lr=..., momentum=0.9)   # 1 value per parameter; "
                          "or 8-bit Adam (bitsandbytes)",
                          gain(opt_state // 2)))
    return ranked(out)


def _notebook_namespace() -> tuple[dict | None, Any]:
    ipy = sys.modules.get("IPython")
    shell = ipy.get_ipython() if ipy is not None else None
    return (shell.user_ns if shell is not None else None), shell


def nvml_index_for(torch: Any, device: int, nvml: Any) -> int | None:
    """NVML's index of torch's CUDA device ``device`` (they differ under CUDA_VISIBLE_DEVICES)."""
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid).lower().removeprefix("gpu-")
    except Exception:
        uuid = ""
    if uuid:
        for i in range(nvml.device_count()):
            u = nvml.device_query(i, "nvmlDeviceGetUUID")
            if isinstance(u, str) and u.lower().removeprefix("gpu-") == uuid:
                return i
    if not os.environ.get("CUDA_VISIBLE_DEVICES"):
        return device
    return None


def process_memory(nvml: Any, index: int | None, pid: int | None = None,
                   torch_reserved: int | None = None) -> tuple[int | None, tuple[OtherProcess, ...]]:
    """(this process's bytes, other processes) on NVML GPU ``index``.

    Inside a container NVML may report host PIDs, so ``os.getpid()`` matches none. Then, if
    ``torch_reserved`` is given, the process holding at least that much and at most
    ``CONTEXT_SLACK`` more (CUDA context and libraries) is taken to be this one.
    """
    from gpunb.readings.gpu import read_processes
    from gpunb.readings.nvml import is_available

    if nvml is None or index is None:
        return None, ()
    procs = read_processes(nvml, index)
    if not is_available(procs):
        return None, ()
    pid = os.getpid() if pid is None else pid
    mine = None
    others = []
    for p in procs:
        used = p.used_bytes if isinstance(p.used_bytes, int) else None
        if p.pid == pid:
            mine = used
        else:
            others.append(OtherProcess(p.pid, used, p.name))
    if mine is None and torch_reserved is not None:
        me = own_process(others, torch_reserved)
        if me is not None:
            others.remove(me)
            mine = me.used_bytes
    return mine, tuple(others)


CONTEXT_SLACK = 4 * GiB  # a CUDA context with cuDNN/cuBLAS/NCCL loaded stays well under this


def own_process(processes: list, torch_reserved: int) -> Any:
    """The process whose memory is torch's reserve plus a context's worth, if exactly one fits."""
    fits = [p for p in processes if p.used_bytes is not None and 0 <= p.used_bytes - torch_reserved <= CONTEXT_SLACK]
    return fits[0] if len(fits) == 1 else None


def relabel_earlier(census: Census, before_ids: dict[str, int] | None, namespace: dict | None) -> Census:
    """Mark namespace tensors that are not model/optimizer state and whose variable already
    held the same object before the failing cell started: leftovers from earlier cells."""
    from dataclasses import replace

    if not before_ids or namespace is None:
        return census
    out = []
    for e in census.entries:
        if e.source == NAMESPACE and e.role == "other":
            top = e.name.split(".")[0].split("[")[0]
            if top in before_ids and before_ids[top] == id(namespace.get(top, None)):
                e = replace(e, source=EARLIER_CELLS)
        out.append(e)
    return replace(census, entries=tuple(out))


EARLIER_CELLS = "earlier cells"


def gather_readings(
    exc: BaseException,
    *,
    namespace: dict | None = None,
    nvml: Any = None,
    output_history: dict | None = None,
    before_ids: dict[str, int] | None = None,
    devices: set[str] | None = None,
) -> OomDiagnosis:
    """Read torch, NVML and the namespace now, then :func:`diagnose`."""
    from gpunb.readings.nvml import default_session
    from gpunb.readings.torch_memory import cuda_initialized, imported_torch, read_device

    torch = imported_torch()
    if namespace is None:
        namespace, shell = _notebook_namespace()
    if output_history is None and namespace is not None:
        oh = namespace.get("Out")
        output_history = oh if isinstance(oh, dict) else None
    oom = find_oom(exc) or exc
    msg = parse_oom_message(str(oom))
    device = msg.device if msg is not None and msg.device is not None else 0
    torch_mem = read_device(torch, device) if torch is not None else None
    if devices is None:
        devices = {"cuda"} if cuda_initialized(torch) else None
    census = None
    if torch is not None:
        previous = getattr(sys, "last_value", None)
        exceptions = [(EXCEPTION, exc)]
        if previous is not None and previous is not exc:
            exceptions.append(("older error (sys.last_value)", previous))
        census = take_census(namespace, torch=torch, devices=devices, output_history=output_history,
                             exceptions=exceptions)
        census = relabel_earlier(census, before_ids, namespace)
    hint = batch_size_hint(exc, namespace)
    nvml = nvml if nvml is not None else default_session()
    mine = None
    others: tuple[OtherProcess, ...] = ()
    if torch is not None and cuda_initialized(torch):
        mine, others = process_memory(nvml, nvml_index_for(torch, device, nvml),
                                      torch_reserved=torch_mem.reserved_bytes if torch_mem else None)
    return diagnose(exc, torch_memory=torch_mem, census=census, other_processes=others, this_process_bytes=mine,
                    batch_size=hint)


BATCH_NAMES = ("batch_size", "bs", "batch", "micro_batch_size", "per_device_train_batch_size")


def batch_size_hint(exc: BaseException, namespace: dict | None = None) -> tuple[str, int] | None:
    """The batch size the failing code used, if a frame (or the notebook) names it plainly."""
    from gpunb.analysis.tensor_census import exception_holders

    def pick(values: dict) -> tuple[str, int] | None:
        for name in BATCH_NAMES:
            v = values.get(name)
            if type(v) is int and v > 1:  # type(), not isinstance(): a proxy's __class__ may raise
                return name, v
        return None

    for fn, local_vars in exception_holders(exc):
        found = pick(local_vars)
        if found:
            return f"{fn}() {found[0]}", found[1]
    return pick(namespace or {})


def diagnose_oom(exc: BaseException | None = None, *, namespace: dict | None = None, nvml: Any = None) -> OomDiagnosis:
    """Public API: explain a CUDA out-of-memory error (``gpunb.diagnose_oom(exc)``).

    Without ``exc`` it uses the last error of this session (``sys.last_value``). It reads
    torch's allocator and NVML now, and names the live tensors of ``namespace`` (the
    notebook's by default). It frees nothing: the automatic hook does that after an OOM,
    and ``%gpumem --release`` does it on demand.
    """
    if exc is None:
        exc = getattr(sys, "last_value", None)
    if not isinstance(exc, BaseException) or find_oom(exc) is None:
        raise ValueError(
            "gpunb.diagnose_oom needs a CUDA out-of-memory error: "
            + ("no error was raised in this session yet." if exc is None else f"got {type(exc).__name__}: {exc}")
            + " Pass the exception: `except torch.OutOfMemoryError as e: gpunb.diagnose_oom(e)`."
        )
    return gather_readings(exc, namespace=namespace, nvml=nvml)
