"""The OOM doctor: why a CUDA allocation failed, and what to change.

Inputs are readings, never guesses: the numbers in torch's message, the allocator's
statistics, NVML's per-process memory (this kernel vs other processes) and the census of
live tensors. Causes are named from those; fixes carry an estimated saving for this case.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Protocol

from gpunb import units
from gpunb.analysis.advice import Advice
from gpunb.analysis.memory.census import EXCEPTION, NAMESPACE, Census, take_census
from gpunb.analysis.memory.oom_message import OomMessage, find_oom, parse_oom_message
from gpunb.analysis.memory.oom_records import Cause, OomDiagnosis, OtherProcess
from gpunb.readings.devices import match_by_reserve
from gpunb.readings.torch_state import AllocatorStats

GiB = 2**30
CUDA_NOTES = "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"

# Cause identifiers (stable: tests and the GPU measurements key on them).
TOO_LARGE_FOR_GPU = "request-exceeds-gpu"
OTHER_PROCESSES = "other-processes"
LEFTOVERS = "leftovers"
FRAGMENTATION = "fragmentation"
WORKING_SET = "working-set"  # the cell itself needs more than is free: batch/activations


class FitSummary(Protocol):
    """What the doctor quotes of a ``%gpufit`` result (``fit.records.BatchFit`` has it); passed in by
    the caller, so the memory capability does not import the fit capability."""

    @property
    def recommended(self) -> int | None: ...
    @property
    def safety(self) -> float: ...
    @property
    def verified(self) -> int | None: ...
    @property
    def step_name(self) -> str: ...
    @property
    def steps(self) -> int: ...
    @property
    def capacity_bytes(self) -> int | None: ...


class PlanSummary(Protocol):
    """What the doctor quotes of a ``gpunb.plan`` result (``plan.records.StepPlan`` has it); passed in
    by the caller, as the last fit is."""

    @property
    def step_name(self) -> str: ...
    def largest_batch_for(self, total_bytes: int, non_torch_bytes: int | None = None) -> int | None: ...


def gib(n: int | None) -> str:
    return units.gib(n, digits=2)


def _planned(plan: PlanSummary | None, budget: tuple[int, int | None] | None) -> tuple[int, str] | None:
    """(the largest batch the plan says fits this GPU, the plan's step), or None. ``budget``: the
    GPU's memory and what of it is not torch's (None: not known, the plan allows for a context)."""
    if plan is None or budget is None:
        return None
    try:
        best = plan.largest_batch_for(*budget)
    except Exception:  # noqa: BLE001 (a quote the diagnosis can do without)
        return None
    return (best, plan.step_name) if best else None


def _frac(part: int | None, whole: int | None) -> float | None:
    if part is None or not whole:
        return None
    return max(0.0, min(1.0, part / whole))


def diagnose(
    exc: BaseException | None = None,
    *,
    message: str | None = None,
    torch_memory: AllocatorStats | None = None,
    census: Census | None = None,
    other_processes: tuple[OtherProcess, ...] = (),
    this_process_bytes: int | None = None,
    allocator_conf: str | None = None,
    batch_size: tuple[str, int] | None = None,
    last_fit: FitSummary | None = None,
    last_plan: PlanSummary | None = None,
) -> OomDiagnosis:
    """Diagnose from readings (all optional except the exception or its message).
    ``last_fit``: this kernel's last ``%gpufit`` result, quoted in the batch-size fix; ``last_plan``:
    its last ``%gpuplan``, whose line in the batch size says how much of the batch fits.

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
            me = match_by_reserve(others, allocated + (unalloc or 0))
            if me is not None:
                others.remove(me)
                process = me.used_bytes
    other_bytes = sum(p.used_bytes or 0 for p in others)

    # Only tensors on the failing GPU hold its memory: CPU tensors in the census are shown, never counted.
    on_gpu = [e for e in census.entries if _on_device(e.device, m.device)] if census else []
    by_role: dict[str, int] = {}
    for e in on_gpu:
        by_role[e.role] = by_role.get(e.role, 0) + e.nbytes
    params = by_role.get("parameter", 0)
    grads = by_role.get("gradient", 0)
    opt_state = by_role.get("optimizer state", 0)
    fp32_params = any(e.role == "parameter" and e.dtype == "float32" for e in on_gpu)
    leftover_entries = [e for e in on_gpu if e.source != NAMESPACE and e.source != EXCEPTION]
    # Leftovers: not the model/optimizer, and not the failed cell's frames — tensors kept
    # from earlier cells (namespace "other" that predates the failing cell is passed by the
    # hook as source "earlier cells"), the output history and older exceptions.
    leftover_bytes = sum(e.nbytes for e in leftover_entries)
    frames_bytes = sum(e.nbytes for e in on_gpu if e.source == EXCEPTION)

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
        names = ", ".join(f"{p.label}: {gib(p.used_bytes)}" for p in others[:4])
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
    sufficient = {code: None if g is None or requested is None or free is None else free + g >= requested
                  for code, g in gives.items()}
    causes = _ranked_causes(causes, sufficient)

    fixes = _fixes(causes, needed=needed, requested=requested, free=free, unalloc=unalloc, params=params, grads=grads,
                   opt_state=opt_state, allocated=allocated, leftover_entries=leftover_entries,
                   fp32_params=fp32_params if census is not None and on_gpu else None, others=others,
                   expandable_on=expandable_on, batch_size=batch_size, gives=gives, sufficient=sufficient,
                   last_fit=last_fit, last_plan=last_plan,
                   budget=(allowed, 0) if allowed is not None else (total, m.non_torch_bytes) if total else None)
    notes = []
    if census is not None and census.skipped_count:
        notes.append(census.skipped_note())
    if frames_bytes:
        notes.append(f"the failed cell's frames hold {gib(frames_bytes)} of tensors until released")
    if process is not None and m.non_torch_bytes is not None:
        notes.append(f"CUDA context and non-PyTorch libraries: {gib(m.non_torch_bytes)}")
    return OomDiagnosis(etype, msg, causes, fixes, census, torch_memory, tuple(others), process, None, notes,
                        requested_bytes=requested, free_bytes=free)


def _on_device(device: str, index: int | None) -> bool:
    """Is a census entry's device ("cuda:0", "cpu") the GPU that ran out (any GPU if unknown)?"""
    if not device.startswith("cuda"):
        return False
    return index is None or device in (f"cuda:{index}", "cuda")


def _ranked_causes(causes: list[Cause], sufficient: dict[str, bool | None]) -> list[Cause]:
    """First a request no freeing can satisfy; then the causes whose memory alone, given back, would
    have let the request fit (largest first); then those we cannot tell about (in the order found);
    then the cell's own working set (a smaller batch always helps); last, causes too small to
    suffice alone (largest first): they are real, but removing them would not have been enough."""
    def key(ic: tuple[int, Cause]) -> tuple[Any, ...]:
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
           leftover_entries: list[Any], fp32_params: bool | None, others: list[OtherProcess],
           expandable_on: bool, batch_size: tuple[str, int] | None = None,
           gives: dict[str, int | None] | None = None, sufficient: dict[str, bool | None] | None = None,
           last_fit: FitSummary | None = None, last_plan: PlanSummary | None = None,
           budget: tuple[int, int | None] | None = None) -> list[Advice]:
    """The fixes, each with the memory it would save here, ranked: the one thing that can work for
    a request larger than the GPU; for a working-set failure the batch size, bf16 autocast and
    activation checkpointing; then by whether the saving covers the shortfall, and its size."""
    codes = {c.code for c in causes}
    short = None if requested is None or free is None else max(0, requested - free)
    gives, sufficient = gives or {}, sufficient or {}
    out: list[tuple[tuple[Any, ...], Advice]] = []  # (rank key, fix)
    order = {c.code: i for i, c in enumerate(causes)}

    def add(title: str, reason: str, how: str, saving: int | None, link: str = "", covers: bool | None = None,
            group: int = 2, cause: str = WORKING_SET, sure: bool = False) -> None:
        """``sure``: the saving is what giving that memory back returns, or a batch chosen to fit;
        else it is an estimate (bf16 halves activations, checkpointing keeps block inputs)."""
        if covers is None:
            covers = saving is not None and short is not None and saving >= short
        fix = Advice(title, reason, how, _frac(saving, needed), link, severity=2 if covers else 1,
                     saving_bytes=None if saving is None else int(saving))
        if group < 2:  # in the order added (the order for a working-set failure), covering first
            key: tuple[Any, ...] = (group, not covers, len(out))
        else:  # covering first, sure before estimated, the cause's rank, then the larger saving
            key = (group, not covers, not sure, order.get(cause, len(order)), -(saving or 0))
        out.append((key, fix))

    def freeing(code: str, nbytes: int | None) -> tuple[int | None, bool]:
        """(saving, covers) of giving a cause's memory back: only what the request could have used
        (nothing, for other processes under a cap), and it covers only if that would have sufficed."""
        g = gives.get(code)
        return (nbytes if g is None else g), sufficient.get(code) is not False and (
            sufficient.get(code) is True or (short is not None and (g if g is not None else nbytes or 0) >= short))

    if TOO_LARGE_FOR_GPU in codes:
        add("Split the operation that asked for one huge block",
            f"a single allocation of {gib(requested)} exceeds the GPU; look at the line in the traceback",
            "Process the tensor in chunks (e.g. `torch.split` / a loop over the batch), or reduce the "
            "sequence length/resolution that sets its size.", None, covers=True, group=0)
    if LEFTOVERS in codes:
        names = [e.name for e in leftover_entries if not e.name.startswith(("Out[", "_"))][:5]
        outs = [e.name for e in leftover_entries if e.name.startswith("Out[")][:5]
        how = []
        if names:
            how.append("%gpumem --free " + " ".join(n.split(".")[0].split("[")[0] for n in names))
        if outs:
            how.append("%reset -f out   # output history holds: " + ", ".join(outs))
        held = sum(e.nbytes for e in leftover_entries)
        saving, covers = freeing(LEFTOVERS, held)
        add("Free leftovers from earlier cells", f"{gib(held)} held by " + ", ".join(
            e.name for e in leftover_entries[:4]), "\n".join(how) or "del <name>; then %gpumem", saving, covers=covers,
            cause=LEFTOVERS, sure=True)
    if OTHER_PROCESSES in codes:
        other = sum(p.used_bytes or 0 for p in others)
        held_by = ", ".join(p.label if p.holder else str(p.pid) for p in others[:5])
        if not any(p.holder for p in others[:5]):
            held_by = f"PID {held_by} (another kernel or job)"
        saving, covers = freeing(OTHER_PROCESSES, other)
        add("Free the GPU from other processes",
            f"{gib(other)} held by {held_by}" + ("" if covers else " (freeing them alone would not have been enough)"),
            "Shut down idle kernels (JupyterLab: Running tab) or use another GPU "
            "(`CUDA_VISIBLE_DEVICES`); `nvidia-smi` lists them.", saving, covers=covers, cause=OTHER_PROCESSES,
            sure=True)
    if FRAGMENTATION in codes and not expandable_on:
        saving, covers = freeing(FRAGMENTATION, unalloc)
        add("Turn on expandable segments", f"{gib(unalloc)} was reserved but unallocated: fragmentation",
            "import os; os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'  "
            "# before torch first uses CUDA: restart the kernel, set it in the first cell", saving, CUDA_NOTES,
            covers=covers, cause=FRAGMENTATION, sure=True)
    if WORKING_SET in codes or LEFTOVERS in codes or FRAGMENTATION in codes:
        _working_set_fixes(add, causes, short=short, requested=requested, allocated=allocated,
                           fixed=params + grads + opt_state + sum(e.nbytes for e in leftover_entries),
                           fp32_params=fp32_params, batch_size=batch_size, last_fit=last_fit,
                           group=1 if causes and causes[0].code == WORKING_SET else 2,
                           planned=_planned(last_plan, budget))
    if grads:
        add("Drop gradients between steps (set_to_none)",
            f"{gib(grads)} of gradients were alive during the failing step",
            "optimizer.zero_grad(set_to_none=True)   # or model.zero_grad(set_to_none=True) before eval", grads,
            sure=True)
    if opt_state:
        add("Use a lighter optimizer", f"optimizer state holds {gib(opt_state)} (Adam keeps 2 values per parameter)",
            "torch.optim.SGD(model.parameters(), lr=..., momentum=0.9)   # 1 value per parameter; "
            "or 8-bit Adam (bitsandbytes)", opt_state // 2)
    out.sort(key=lambda kf: kf[0])
    return [a for _, a in out]


def _working_set_fixes(add: Any, causes: list[Cause], *, short: int | None, requested: int | None,
                       allocated: int | None, fixed: int, fp32_params: bool | None,
                       batch_size: tuple[str, int] | None, group: int, last_fit: FitSummary | None,
                       planned: tuple[int, str] | None = None) -> None:
    """Smaller batch, gradient accumulation, bf16 autocast, activation checkpointing, with savings from
    the working set measured at the failure: what torch had allocated beyond the model, its
    gradients, optimizer state and leftovers (activations and temporaries of this batch), plus the
    request itself. Without the allocator's numbers the request alone is a lower bound."""
    need = None
    if requested is not None:
        need = requested + (max(0, allocated - fixed) if allocated is not None else 0)
    at_least = "" if allocated is not None else "at least "
    fits = None if need is None or short is None or need <= 0 else max(0.0, 1.0 - short / need)
    reason = ""
    if planned is not None and batch_size is not None and batch_size[1] > planned[0] >= 1:
        # the plan's own line in the batch size: what the working set at the failure cannot say
        where, value = batch_size
        share = planned[0] / value
        reason = (f"at most ≈{share * 100:.0f} % of the batch fits ({where} = {value} → at most ≈{planned[0]}, "
                  f"planned by gpunb.plan({planned[1]}))")
        fits = share
    elif need is not None and short is not None:
        reason = f"this batch's activations and temporaries needed {at_least}{gib(need)} and {gib(short)} was missing"
        if fits:
            reason += f": at most ≈{fits * 100:.0f} % of the batch fits"
            if batch_size is not None:
                where, value = batch_size
                reason += f" ({where} = {value} → at most ≈{max(1, math.floor(value * fits))})"
        else:
            reason += ": even a batch of one would not fit; the fixed part (model, optimizer) is too large"
    how = "%gpufit step   # the largest batch that trains a sustained run, measured in a few trials"
    fit = last_fit
    if fit is not None and fit.recommended:
        measured = "it" if not fit.safety else f"{fit.verified} (less {fit.safety * 100:.0f} % for safety)"
        how = (f"batch_size = {fit.recommended}   # %gpufit {fit.step_name or 'step'} measured {measured} trains "
               f"{fit.steps} steps in {gib(fit.capacity_bytes)} (this kernel); run it again if the model changed")
    shrink = (short if fits else need) if need is not None and short is not None else None
    add("Use a smaller batch", reason or "the cell's own activations did not fit", how, shrink,
        covers=bool(fits), group=group, sure=True)
    add("Keep the effective batch with gradient accumulation",
        "micro-batches of the smaller size use its memory and, accumulated, train like the large batch",
        "loss = loss / accum_steps; loss.backward()\n"
        "if (i + 1) % accum_steps == 0: optimizer.step(); optimizer.zero_grad(set_to_none=True)", shrink,
        covers=bool(fits), group=2, sure=True)  # after the three the issue names: it is the batch fix again
    if fp32_params is not False:
        add("Train in bf16 autocast",
            f"activations stored in bf16 take half the bytes of fp32: ≈{gib(need // 2)} of the {at_least}{gib(need)}"
            if need is not None else "activations stored in bf16 take half the bytes of fp32",
            "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = model(x)...",
            None if need is None else need // 2, "https://docs.pytorch.org/docs/stable/amp.html", group=group)
    add("Use activation checkpointing",
        "each checkpointed block keeps only its input and recomputes the rest in backward (≈ +30 % compute); with "
        "four or more equal blocks at least half of the activations go"
        + (f": ≈{gib(need // 2)}" if need is not None else ""),
        "from torch.utils.checkpoint import checkpoint\nh = checkpoint(block, h, use_reentrant=False)",
        None if need is None else need // 2, "https://docs.pytorch.org/docs/stable/checkpoint.html", group=group)


def name_holders(others: tuple[OtherProcess, ...]) -> tuple[OtherProcess, ...]:
    """Name other processes by notebook when this kernel's Jupyter server can say (a short,
    bounded wait; without a server the PIDs stay as they are)."""
    if not others:
        return others
    from dataclasses import replace

    from gpunb.analysis.holders.server import ask_server, names_by_pid

    names = names_by_pid(ask_server(wait=True))
    return tuple(replace(p, holder=names.get(p.pid, "")) for p in others)


def relabel_earlier(census: Census, before_ids: dict[str, int] | None, namespace: dict[str, Any] | None) -> Census:
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
PREVIOUS_ERROR = "older error (sys.last_value)"  # census label of tensors an earlier exception's frames hold


def gather_readings(
    exc: BaseException,
    *,
    namespace: dict[str, Any] | None = None,
    nvml: Any = None,
    output_history: dict[int, Any] | None = None,
    before_ids: dict[str, int] | None = None,
    devices: set[str] | None = None,
    last_fit: FitSummary | None = None,
    last_plan: PlanSummary | None = None,
) -> OomDiagnosis:
    """Read torch, NVML and ``namespace`` (the notebook's variables, given by the caller) now,
    then :func:`diagnose`."""
    from gpunb.readings.devices import read_device_map, read_ownership
    from gpunb.readings.nvml import default_session
    from gpunb.readings.torch_state import cuda_initialized, imported_torch, read_device_memory

    torch = imported_torch()
    if output_history is None and namespace is not None:
        oh = namespace.get("Out")
        output_history = oh if isinstance(oh, dict) else None
    oom = find_oom(exc) or exc
    msg = parse_oom_message(str(oom))
    device = msg.device if msg is not None and msg.device is not None else 0
    torch_mem = read_device_memory(torch, device) if torch is not None else None
    if devices is None:
        devices = {"cuda"} if cuda_initialized(torch) else None
    census = None
    if torch is not None:
        previous = getattr(sys, "last_value", None)
        exceptions = [(EXCEPTION, exc)]
        if previous is not None and previous is not exc:
            exceptions.append((PREVIOUS_ERROR, previous))
        census = take_census(namespace, torch=torch, devices=devices, output_history=output_history,
                             exceptions=exceptions)
        census = relabel_earlier(census, before_ids, namespace)
    hint = batch_size_hint(exc, namespace)
    nvml = nvml if nvml is not None else default_session()
    mine = own = None
    others: tuple[OtherProcess, ...] = ()
    if torch is not None and cuda_initialized(torch) and nvml.start().ok:
        device_map = read_device_map(nvml, torch=torch)
        index = device_map.nvml_index(device)
        if index is not None:
            own = read_ownership(nvml, index, torch=torch, device_map=device_map)
            mine = own.self_bytes
            others = name_holders(tuple(OtherProcess(p.pid, p.used_bytes if isinstance(p.used_bytes, int) else None,
                                                     p.name) for p in own.others))
    diagnosis = diagnose(exc, torch_memory=torch_mem, census=census, other_processes=others,
                         this_process_bytes=mine, batch_size=hint, last_fit=last_fit, last_plan=last_plan)
    if own is not None and own.children_bytes:
        diagnosis.notes.append(f"this kernel's child processes (DataLoader workers, ranks) hold "
                               f"{gib(own.children_bytes)} of this GPU")
    return diagnosis


BATCH_NAMES = ("batch_size", "bs", "batch", "micro_batch_size", "per_device_train_batch_size")


def batch_size_hint(exc: BaseException, namespace: dict[str, Any] | None = None) -> tuple[str, int] | None:
    """The batch size the failing code used, if a frame (or the notebook) names it plainly."""
    from gpunb.analysis.memory.census import exception_holders

    def pick(values: dict[str, Any]) -> tuple[str, int] | None:
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
