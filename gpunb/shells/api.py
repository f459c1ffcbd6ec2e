"""The public Python API, the twins of the magics: ``gpunb.check()``, ``gpunb.profile()``,
``gpunb.memory()``, ``gpunb.diagnose_oom()``, ``gpunb.fit_batch_size()``, ``gpunb.plan()``, ``gpunb.energy()``
(``gpunb.monitor()`` lives with its live output in :mod:`gpunb.shells.monitor`).

Each is thin: it finds the IPython shell when there is one, hands the analysis layer what
that needs (the notebook's namespace, a progress callback, whether it runs in a kernel),
and displays where the magic would. Heavy modules are imported on first call, so
``import gpunb`` stays cheap.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from gpunb.display import DisplayMixin, Render
from gpunb.shells.session import ProgressLine, current_shell, display_or_print

if TYPE_CHECKING:
    from gpunb.analysis.checks.records import CheckReport
    from gpunb.analysis.energy.since_load import SessionEnergy
    from gpunb.analysis.fit.records import BatchFit
    from gpunb.analysis.memory.oom_records import OomDiagnosis
    from gpunb.analysis.memory.records import MemoryReport
    from gpunb.analysis.profile.records import CellProfile
    from gpunb.readings.nvml import NvmlSession
    from gpunb.shells.kernel_state import KernelState


def check(
    quick: bool = False,
    device: int | None = None,
    *,
    deep: bool = False,
    environ: Mapping[str, str] | None = None,
    nvml: NvmlSession | None = None,
    progress: Callable[[CheckReport], None] | None = None,
    in_kernel: bool | None = None,
    probe_timeout_s: float = 180.0,
    require_gpu: bool = False,
) -> CheckReport:
    """Run the setup checklist and return a :class:`~gpunb.analysis.checks.records.CheckReport`.

    quick: skip the subprocess measurements (CUDA smoke test, matmul and copy speed).
    device: check only ``cuda:N`` (numbered as CUDA sees GPUs under CUDA_VISIBLE_DEVICES).
    deep: also an NCCL all-reduce across every GPU (one subprocess each, killed after 90 s),
        its sum checked and its bus bandwidth compared with the links between the GPUs.
    progress: called with the partial report whenever a step starts or finishes.
    in_kernel: whether to report this process's CUDA state as a notebook kernel's (default:
        inside IPython); it is reported anyway once this process has imported torch.
    require_gpu: a machine without an NVIDIA GPU is a failure (``report.ok`` is False);
        by default it is the laptop's ordinary state: the GPU checks are skipped, ``ok`` True.
    """
    from gpunb.analysis.checks.checklist import check as run_checks

    return run_checks(quick, device, deep=deep, environ=environ, nvml=nvml, progress=progress,
                      in_kernel=current_shell() is not None if in_kernel is None else in_kernel,
                      probe_timeout_s=probe_timeout_s, require_gpu=require_gpu)


def _frame_variables(frame: Any) -> Callable[[], dict[str, Any]]:
    """The variables a frame sees now: its globals, then its locals (a notebook cell's are the
    same dict; a function's locals are read afresh at each look, so a rebound name is seen)."""
    def variables() -> dict[str, Any]:
        local = frame.f_locals
        return local if local is frame.f_globals else {**frame.f_globals, **local}

    return variables


def _applied_to(render: Render, result: Any) -> Render:
    """A view of ``profile`` that renders the finished cell's record, whatever it is asked for."""
    return lambda _: render(result)


class ResultBlock(DisplayMixin):
    """A ``with`` block whose ``result`` is a record once it ends: the block displays the record,
    ``to_dict()`` gives its data, and its fields read as the block's own (``p.steps``)."""

    result: Any = None
    NOT_FINISHED = "not finished yet"

    def _repr_views_(self) -> dict[str, Render]:
        result = self.result
        if result is None:
            return {"text/plain": lambda _: self.NOT_FINISHED}
        return {mimetype: _applied_to(render, result) for mimetype, render in result._repr_views_().items()}

    def to_dict(self) -> dict[str, Any]:
        return self.result.to_dict() if self.result else {}

    def __getattr__(self, name: str) -> Any:
        result = self.__dict__.get("result")
        if result is not None and not name.startswith("_"):
            return getattr(result, name)
        raise AttributeError(name)


class profile(ResultBlock):  # noqa: N801  (used like a function: `with gpunb.profile():`)
    """``with gpunb.profile() as p:`` measures the block like ``%%gpuprofile`` measures a cell.

    After the block ``p.result`` is the :class:`~gpunb.analysis.profile.records.CellProfile`
    (``p`` itself displays it, and ``p.to_dict()`` gives plain data). An exception in the
    block is recorded and then propagates unchanged. Options: ``warmup_steps`` (steps left out
    of median/p90), ``reset_peak`` (reset torch's global peak-memory counter; False leaves it
    untouched), ``timeline`` (memory points at most every 200 ms at step ends), ``label``,
    ``show`` (display the report when the block ends; default: when running in
    IPython/Jupyter), ``record`` (add it to ``%gpuprofile history``; without the extension
    loaded, to the history ``%load_ext gpunb`` takes over), ``flops`` (count the FLOPs of
    step 2 for TFLOP/s and MFU; default on), ``ops`` (torch.profiler over steps 4-6: top
    operators and kernels, time shares, a trace file), ``trace_dir`` (where the trace goes;
    default: the working directory, in Jupyter the notebook's), ``ranks`` (profile the worker
    processes the block starts: torchrun, torch.multiprocessing, notebook_launcher), ``energy``
    (meter the GPUs' energy and PCIe/NVLink traffic: ``p.result.energy``, ``p.result.links``;
    default on), ``tokens_per_sample`` (the sequence length, for tokens/s and tokens/J; default:
    read from the first batch when it holds token ids), ``leak`` (report memory that grows with
    every step and the variable holding it: a few censuses of ``namespace``, default the
    variables of the code around the ``with``, within 0.5 % of the block's time).
    """

    NOT_FINISHED = "gpunb.profile: not finished yet (use it as `with gpunb.profile() as p:`)"

    def __init__(self, label: str = "", *, warmup_steps: int = 1, reset_peak: bool = True,
                 timeline: bool = True, show: bool | None = None, record: bool = True, flops: bool = True,
                 ops: bool = False, trace_dir: Any = None, ranks: bool = True, energy: bool = True,
                 tokens_per_sample: int | None = None, leak: bool = True,
                 namespace: Mapping[str, Any] | None = None) -> None:
        from gpunb.analysis.profile.cell import ProfileSession

        if not isinstance(label, str):
            raise TypeError(f"label must be a string, got {type(label).__name__}")
        self._session = ProfileSession(label=label, warmup_steps=warmup_steps, reset_peak=reset_peak,
                                       timeline=timeline, flops=flops, ops=ops, trace_dir=trace_dir, ranks=ranks,
                                       energy=energy, tokens_per_sample=tokens_per_sample, leak=leak,
                                       namespace=namespace)
        self.show = show
        self.record = record
        self.result: CellProfile | None = None

    def __enter__(self) -> profile:
        if self._session.namespace is None:  # the variables of the code around the `with`
            self._session.namespace = _frame_variables(sys._getframe(1))
        self._session.start()
        return self

    def __exit__(self, etype: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        try:
            self.result = self._session.stop(exc)
        finally:
            self._session.namespace = None  # the caller's frame: not kept beyond the block
        if self.record:
            from gpunb.analysis.profile.history import RunOf
            from gpunb.shells.extension import kernel_state

            kernel_state().profile_history.add(self.result, RunOf.of(label=self.result.label))
        # in a notebook the report appears like %%gpuprofile's; in scripts only on request
        if self.show if self.show is not None else current_shell() is not None:
            display_or_print(self.result)
        return False  # never swallow the user's exception



def memory(
    *,
    free: Iterable[str] = (),
    top: int = 20,
    all_devices: bool = False,
    namespace: dict | None = None,
    shell: Any = None,
    nvml: NvmlSession | None = None,
) -> MemoryReport:
    """Where GPU memory goes now (``%gpumem``). ``free=["x"]`` deletes variables first.

    Tensors are named by the notebook's variables (``namespace``, default: the running
    shell's). Tensors shown are CUDA tensors when this kernel uses CUDA; otherwise (or with
    ``all_devices``) tensors on every device, so it also explains a CPU session.
    """
    from gpunb.analysis.memory.report import memory as read_memory

    shell = shell if shell is not None else current_shell()
    if namespace is None:
        namespace = shell.user_ns if shell is not None else {}
    return read_memory(free=free, top=top, all_devices=all_devices, namespace=namespace, shell=shell, nvml=nvml)


def diagnose_oom(exc: BaseException | None = None, *, release: bool = False, namespace: dict | None = None,
                 nvml: NvmlSession | None = None) -> OomDiagnosis:
    """Explain a CUDA out-of-memory error: what was asked and free, why it failed, the live
    tensors by variable name, ranked fixes.

    Without ``exc`` it uses the session's last error (``sys.last_value``). It reads torch's
    allocator and NVML now and names the tensors of ``namespace`` (default: the notebook's).
    It frees nothing unless ``release=True``: then it also gives back what the error pins,
    as the automatic doctor does after a failed cell (for an error you caught yourself:
    ``except torch.OutOfMemoryError as e``); that needs an IPython/Jupyter session.
    """
    from gpunb.analysis.fit.search import last_fit
    from gpunb.analysis.memory.oom import gather_readings
    from gpunb.analysis.memory.oom_message import find_oom
    from gpunb.analysis.plan.planner import last_plan

    exc = exc if exc is not None else getattr(sys, "last_value", None)
    shell = current_shell()
    if release and shell is None:
        raise RuntimeError("diagnose_oom(release=True) needs an IPython/Jupyter session: it releases what the "
                           "notebook's traceback and output history pin. Outside one, `del` the exception and "
                           "call torch.cuda.empty_cache().")
    if not isinstance(exc, BaseException) or find_oom(exc) is None:
        raise ValueError(
            "gpunb.diagnose_oom needs a CUDA out-of-memory error: "
            + ("no error was raised in this session yet." if exc is None else f"got {type(exc).__name__}: {exc}")
            + " Pass the exception: `except torch.OutOfMemoryError as e: gpunb.diagnose_oom(e)`."
        )
    if release:
        from gpunb.shells.extension import kernel_state
        from gpunb.shells.oom_hook import handle_oom, keep_traceback

        return handle_oom(shell, exc, keep=keep_traceback(kernel_state(shell)))
    if namespace is None and shell is not None:
        namespace = shell.user_ns
    return gather_readings(exc, namespace=namespace, nvml=nvml, last_fit=last_fit(), last_plan=last_plan())


def fit_batch_size(
    step_fn: Callable[[int], Any],
    *,
    start: int = 2,
    max_batch: int | None = None,
    margin: float = 0.0,
    device: Any = None,
    steps: int = 50,
    tolerance: float = 0.05,
    max_trials: int = 6,
    progress: Callable[[str], None] | bool | None = True,
    plan: bool = True,
) -> BatchFit:
    """The largest batch size ``step_fn(batch_size)`` trains with on this GPU (``%gpufit``).

    ``step_fn`` runs one full training step (forward, backward, optimizer step) at the
    given batch size. Each trial is a sustained run of ``steps`` steps that starts as a fresh
    process would (optimizer state and gradients emptied, the cache given back); ``verified``
    is the largest batch whose run trained, ``recommended`` that less 3 % when it was at the
    limit. ``margin`` keeps that fraction of the memory free on top. The trials train the
    model; the optimizers' own state is put back afterwards.
    ``progress``: True shows one line that updates in place (printed lines outside IPython),
    a function receives each line, False/None shows nothing. ``plan``: start the search at the
    largest batch ``gpunb.plan`` finds for this GPU (fewer trials; no GPU memory used to plan).
    Note: this resets torch's peak-memory counters of the device.
    """
    from gpunb.analysis.fit.search import fit_batch_size as fit

    say = progress if callable(progress) else ProgressLine("gpunb %gpufit: ") if progress else None
    planner = None
    if plan:
        from gpunb.analysis.plan.planner import largest_under

        def planner(capacity: int) -> int | None:
            return largest_under(step_fn, capacity, start=max(8, start))

    return fit(step_fn, start=start, max_batch=max_batch, margin=margin, device=device, steps=steps,
               tolerance=tolerance, max_trials=max_trials, progress=say, planner=planner)


def plan(
    step_fn: Callable[[int], Any],
    batch_size: int,
    gpus: Any = None,
    *,
    model: Any = None,
    optimizer: Any = None,
) -> Any:
    """Predict ``step_fn(batch_size)``'s peak GPU memory without a GPU (``%gpuplan``).

    The step runs twice on stand-in tensors (no GPU memory, no CUDA context; your model,
    optimizer and random generators are given back as they were): every allocation is recorded
    with its role and line, and replayed through a model of CUDA's caching allocator. Returns a
    ``StepPlan``: the peak, where it is, the error band from calibration, and for each GPU in
    ``gpus`` (names like ``"T4"``, ``"A100 80 GB"``, or sizes in GiB like ``24``; default a few
    common ones) whether the batch fits and the largest batch that does. ``model``/``optimizer``:
    when gpunb does not find them from the step. A step it cannot plan gives a StepPlan whose
    ``problem`` says why.
    """
    from gpunb.analysis.memory.alloc_sites import shell_cell_numbers
    from gpunb.analysis.plan.planner import plan as make_plan

    if isinstance(gpus, (str, int, float)):
        gpus = [gpus]
    shell = current_shell()
    numbers = shell_cell_numbers(getattr(shell, "compile", None)) if shell is not None else {}
    return make_plan(step_fn, batch_size, gpus, model=model, optimizer=optimizer, cell_numbers=numbers)


def set_tariff(*, price: str | None = None, carbon: str | None = None, forget: bool = False) -> str:
    """Set (or with ``forget`` clear) this kernel's price and carbon intensity; a value not given
    keeps the one in effect. Returns the tariff now in effect, in words. Raises ValueError
    for a price or intensity it cannot read."""
    import dataclasses

    from gpunb.analysis.energy.tariff import parse_carbon, parse_price, set_session_tariff, tariff_in_effect

    if forget:
        set_session_tariff(None)
    else:
        tariff = tariff_in_effect()[0]
        if price is not None:
            per_kwh, currency = parse_price(price)
            tariff = dataclasses.replace(tariff, price_per_kwh=per_kwh, currency=currency)
        if carbon is not None:
            tariff = dataclasses.replace(tariff, carbon_g_per_kwh=parse_carbon(carbon))
        set_session_tariff(tariff)
    tariff, source, notes = tariff_in_effect()
    if tariff.empty:
        words = "no price or carbon intensity set: energy is shown in Wh and J only"
    else:
        words = f"energy is priced at {tariff.words()} ({source})"
    return "; ".join([words, *notes])


def energy(*, price: str | None = None, carbon: str | None = None, forget: bool = False,
           state: KernelState | None = None) -> SessionEnergy:
    """What this kernel's GPUs spent since ``%load_ext gpunb`` (``%gpuenergy``): joules, Wh and
    average W per GPU and summed, money and CO₂ when a tariff is set, and the last profiled
    cell's energy. ``price`` ("0.25/kWh") and ``carbon`` ("350g/kWh") set this kernel's tariff
    first, ``forget`` clears it (see :func:`set_tariff`). Without the extension loaded the
    first call starts the count and later calls report since then.
    """
    from gpunb.analysis.energy.since_load import SINCE_FIRST_CALL, SinceLoad
    from gpunb.analysis.energy.tariff import tariff_in_effect
    from gpunb.readings.nvml import default_session
    from gpunb.shells.extension import kernel_state

    if forget or price is not None or carbon is not None:
        set_tariff(price=price, carbon=carbon, forget=forget)
    state = state if state is not None else kernel_state()
    if state.energy_since_load is None:
        state.energy_since_load = SinceLoad(default_session, since=SINCE_FIRST_CALL)
    last, name = _last_cell_energy(state)
    tariff, source, notes = tariff_in_effect()
    return state.energy_since_load.report(tariff, source, notes, last, name)


def _last_cell_energy(state: KernelState) -> tuple[Any, str]:
    """The latest profiled cell's energy (``CellProfile.energy``) and its name, or (None, "")."""
    for entry in reversed(state.profile_history.entries()):
        if not hasattr(entry, "steps") or not hasattr(entry, "label"):  # a one-line cell, not a profile
            continue
        cell = getattr(entry, "energy", None)
        if cell is None:
            return None, ""
        number = getattr(entry, "cell", None)
        name = f"cell “{entry.label}”" if entry.label else f"cell {number}" if number is not None else "cell"
        return cell, name
    return None, ""
