"""FLOPs and bytes of ONE real training step, counted on the operations that ran.

How: from one optimizer-step hook to the next, a ``TorchDispatchMode`` sees every ATen
operation the step runs (forward, backward, optimizer; CPU or CUDA) after autocast chose its
dtype. Matmul, convolution and attention FLOPs come from torch's own formulas
(``torch.utils.flop_counter``'s registry: 2·M·N·K per matmul, the backward's two matmuls,
convolution and SDPA counts), so the total equals ``FlopCounterMode``'s for the same step.
Not ``FlopCounterMode`` itself: the counted step is paid for in full by the user's loop,
and on the overhead benchmark's launch-bound MLP (``benchmarks/flop_count_cost.py``, 2-core
VM, torch 2.13 CPU) ``FlopCounterMode`` adds 15.2 µs per operation, a dispatch mode that only
calls each operation 3.4, and this one 3.5: its per-operation work is a few tuple reads
(operators keyed by id, formula answers kept per shape), and it calls each operator's C
function directly, without torch's per-call Dynamo guard (its code is marked for Dynamo once).

The mode never changes what runs: each operation is executed exactly as called and its
result returned untouched; counting happens after, and a failure in it is noted, never
raised. ``ignore_compile_internals`` keeps ``torch.compile``'d code compiled (the mode then
sees the operations a compiled graph calls through ATen, such as its matmuls, not its fused
Triton kernels); CUDA-graph replays are not seen at all.

Each FLOP is filed under the precision it ran in: bf16/fp16/fp8 from the inputs' dtype,
fp32 matmuls on CUDA as TF32 when torch allows TF32 for them
(``torch.backends.cuda.matmul.allow_tf32``, set by ``set_float32_matmul_precision('high')``;
convolutions: ``torch.backends.cudnn.allow_tf32``).

Bytes moved (for the memory-bandwidth estimate): every operation's tensor inputs read and
outputs written (in-place and ``out=`` arguments as written, views and fresh ``empty``
buffers as nothing), as if no data stayed in a cache between operations. For eager code,
whose every kernel streams its operands through memory, this is close; L2 hits make the real
traffic lower, fused (compiled) kernels far lower.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from typing import Any

from gpunb.analysis.steps.records import FlopCount

_MODE_CLASSES: dict[int, type] = {}  # id(torch) -> the mode class built on that torch
MAX_ANSWERS = 256  # FLOP answers kept per operator (distinct shapes a model asks about)
_MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm")
_CONV_OPS = ("convolution", "_convolution", "cudnn_convolution", "convolution_overrideable",
             "_slow_conv2d_forward", "convolution_backward")


def _precision_of(dtype_name: str, on_cuda: bool, kind: str, tf32: dict[str, bool]) -> str:
    if dtype_name in ("bfloat16", "float16"):
        return "bf16" if dtype_name == "bfloat16" else "fp16"
    if dtype_name.startswith("float8"):
        return "fp8"
    if dtype_name == "float32":
        return "tf32" if on_cuda and tf32.get(kind) else "fp32"
    if dtype_name == "float64":
        return "fp64"
    return "other"


class _OpInfo:
    """What counting needs to know about one operator, worked out once from its schema."""

    __slots__ = ("answers", "call", "formula", "fresh_out", "func", "hop", "kind", "lists", "moves", "name",
                 "on_shapes", "packet", "written")

    def __init__(self, func: Any, hop_type: Any, plain_call: Any = None) -> None:
        self.func = func  # held: the operator's id is the key it is found by
        # an OpOverload's __call__ only forwards to its C function: calling that saves a frame
        direct = getattr(func, "_op", None)
        plain = direct is not None and plain_call is not None and type(func).__call__ is plain_call
        self.call = direct if plain else func
        self.hop = isinstance(func, hop_type)
        self.formula: Any = None  # the registry's formula this was worked out for
        self.on_shapes: Any = None  # that formula's own function, which takes shapes
        self.answers: dict[tuple[Any, ...], int] = {}  # the formula's FLOPs by shapes and options
        self.name = str(getattr(func, "_overloadpacket", func))
        self.packet = getattr(func, "_overloadpacket", None)  # the FLOP formulas' key
        base = self.name.rsplit(".", 1)[-1]
        self.kind = "matmul" if base in _MATMUL_OPS else "conv" if base in _CONV_OPS else "other"
        self.lists = False  # some argument is a list of tensors (the foreach operators)
        self.written: tuple[int, ...] = ()  # positional operands written in place: read and written
        self.fresh_out = True
        self.moves = not self.hop and not base.startswith(("empty", "new_empty"))
        schema = getattr(func, "_schema", None)
        if schema is None or self.hop:
            return
        written = []
        for i, arg in enumerate(schema.arguments):
            if arg.kwarg_only:  # out= and friends arrive in kwargs
                continue
            kind = str(arg.type)
            if "Tensor" in kind:
                self.lists = self.lists or "[]" in kind or "List" in kind
                if arg.alias_info is not None and arg.alias_info.is_write:
                    written.append(i)
        self.written = tuple(written)
        # a return that aliases an argument (a view, an in-place or out= result) is not new data
        self.fresh_out = all(r.alias_info is None for r in schema.returns)
        if getattr(func, "is_view", False):
            self.moves = False

    def use_formula(self, formula: Any, wrapper_code: Any) -> None:
        """torch registers most formulas wrapped so that they receive shapes: the wrapper maps
        every argument through a pytree walk, which was most of the counting's cost per
        matmul. A wrapped one is called here on shapes directly (an ATen operator's arguments
        are tensors, numbers or flat lists of tensors, so one level is the whole walk)."""
        self.formula = formula  # None: no FLOPs (most operators)
        self.answers = {}
        wrapped = getattr(formula, "__wrapped__", None)  # (wraps() copies the name: the code tells)
        shape_wrapped = wrapped is not None and getattr(formula, "__code__", None) is wrapper_code
        self.on_shapes = wrapped if shape_wrapped else None


def _shape_of(value: Any, tensor: Any) -> Any:
    if isinstance(value, tensor):
        return value.shape
    if isinstance(value, (list, tuple)):
        shapes = [v.shape if isinstance(v, tensor) else v for v in value]
        return shapes if isinstance(value, list) else tuple(shapes)
    return value


def _shapes_key(args: tuple[Any, ...], kwargs: dict[str, Any], tensor: Any) -> tuple[Any, ...] | None:
    """What a FLOP formula's answer depends on: the tensors' shapes and the other arguments
    (None when one of them cannot be a key)."""
    key = tuple(_key_part(a, tensor) for a in args)
    if kwargs:
        key += (tuple((k, _key_part(v, tensor)) for k, v in kwargs.items()),)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _key_part(value: Any, tensor: Any) -> Any:
    if isinstance(value, tensor):
        return value.shape
    if isinstance(value, (list, tuple)):
        return tuple(v.shape if isinstance(v, tensor) else v for v in value)
    return value


def _tensor_bytes(value: Any, tensor: Any) -> int:
    if isinstance(value, tensor):
        return int(value.nbytes)
    if isinstance(value, (list, tuple)):
        return sum(int(v.nbytes) for v in value if isinstance(v, tensor))
    return 0


def _first_tensor(args: tuple[Any, ...], tensor: type) -> Any:
    for a in args:
        if isinstance(a, tensor):
            return a
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], tensor):
            return a[0]
    return None


def _mode_class(torch: Any) -> type:
    """The dispatch mode, built on the user's torch (gpunb never imports torch itself)."""
    known = _MODE_CLASSES.get(id(torch))
    if known is not None:
        return known
    from torch.utils import flop_counter
    from torch.utils._python_dispatch import TorchDispatchMode

    registry = flop_counter.flop_registry  # the live table, not a copy
    # the code object every shape-wrapped formula shares (None on a torch without the wrapper)
    shape_wrapper = getattr(flop_counter, "shape_wrapper", None)
    wrapper_code = getattr(shape_wrapper(lambda: 0), "__code__", None) if callable(shape_wrapper) else None
    tensor = torch.Tensor
    # per operator, for the life of the process (schemas do not change), keyed by id: an
    # OpOverload's __hash__ is Python code, one call per lookup; the info holds the operator,
    # so its id stays its own
    entries: dict[int, tuple[Any, ...]] = {}
    hop_type = getattr(torch._ops, "HigherOrderOperator", ())
    overload = getattr(torch._ops, "OpOverload", None)
    plain_call = overload.__call__ if overload is not None else None  # forwards to ``_op``
    counting_steps = itertools.count(1)

    class StepCountingMode(TorchDispatchMode):
        supports_higher_order_operators = True  # else a cond/checkpoint HOP would raise under the mode

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # torch wraps a mode's __torch_dispatch__ so that Dynamo never traces it: a wrapper
            # that switches Dynamo off and on around every call (~0.6 µs an operation here).
            # Marking the method's code "skip, and all it calls" once does the same for free.
            return not _skip_in_dynamo(cls.__dict__["__torch_dispatch__"])

        @classmethod
        def ignore_compile_internals(cls) -> bool:  # compiled code stays compiled (see module doc)
            return True

        def __init__(self, tf32: dict[str, bool]) -> None:
            super().__init__()  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode.__init__ unannotated
            self.tf32 = tf32
            self.serial = next(counting_steps)  # each operator's formula is looked up again once per count
            self.precisions: dict[Any, str] = {}  # (dtype, on a GPU, kind) -> precision name
            self.inert = False  # set when the mode could not be left: it then only passes calls on
            self.flops = 0
            self.gpu_flops = 0
            self.by_precision: dict[str, int] = {}
            self.by_op: dict[str, int] = {}
            self.bytes = 0
            self.ops = 0
            self.hops = 0
            self.failures = 0
            self.first_failure = ""

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            __tracebackhide__ = True  # IPython hides this frame in the user's tracebacks
            # The user's operation first, exactly as called: its errors are the user's. (An
            # operator seen before is called through the C function its __call__ forwards to.)
            entry = entries.get(id(func))
            call = entry[-1] if entry is not None else func
            out = call(*args, **kwargs) if kwargs else call(*args)
            if self.inert:
                return out
            # Counting, inline: this runs for every operation of the counted step, and the
            # step's time is the user's (benchmarks/flop_count_cost.py).
            try:
                self.ops += 1
                if entry is None or entry[0] != self.serial:
                    entry = self._look_up(func)
                _, info, hop, formula, moves, lists, written, fresh_out, _call = entry
                if hop:
                    self.hops += 1
                    return out
                if formula is not None:
                    self._count_flops(info, args, kwargs, out)
                if moves:  # every tensor read, each written in place read and written, new outputs written
                    moved = 0
                    for a in args:
                        if isinstance(a, tensor):
                            moved += a.nbytes
                        elif lists and isinstance(a, (list, tuple)):
                            moved += _tensor_bytes(a, tensor)
                    for i in written:
                        if i < len(args):
                            moved += _tensor_bytes(args[i], tensor)
                    if kwargs:
                        for a in kwargs.values():
                            moved += _tensor_bytes(a, tensor)  # read, or for out=: written
                    if fresh_out:
                        moved += out.nbytes if isinstance(out, tensor) else _tensor_bytes(out, tensor)
                    self.bytes += moved
            except Exception as exc:  # counting must never break a step
                self.failures += 1
                if not self.first_failure:
                    self.first_failure = f"{func}: {type(exc).__name__}: {exc}"[:300]
            return out

        def _look_up(self, func: Any) -> tuple[Any, ...]:
            """The operator's entry, its formula looked up in the registry again (once per
            counted step: a formula registered later counts)."""
            entry = entries.get(id(func))
            info = entry[1] if entry is not None else _OpInfo(func, hop_type, plain_call)
            formula = registry.get(info.packet) if not info.hop else None
            if formula is not info.formula:
                info.use_formula(formula, wrapper_code)
            # unpacked in one go per operation: (counted step, info, hop, formula, moves bytes,
            # has tensor-list arguments, positions written in place, outputs are new data, what
            # to call); "what to call" last: it is read before the rest
            entry = entries[id(func)] = (self.serial, info, info.hop, info.formula, info.moves, info.lists,
                                         info.written, info.fresh_out, info.call)
            return entry

        def _count_flops(self, info: _OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> None:
            kwargs = kwargs or {}
            # a formula's answer depends on shapes and options only, and a training step asks
            # the same few questions every step: answers are kept per operator
            key = _shapes_key(args, kwargs, tensor)
            n = info.answers.get(key) if key is not None else None
            if n is None:
                if info.on_shapes is not None:  # the formula itself on shapes: no pytree walk per call
                    n = int(info.on_shapes(*[_shape_of(a, tensor) for a in args], out_shape=_shape_of(out, tensor),
                                           **{k: _shape_of(v, tensor) for k, v in kwargs.items()}))
                else:
                    n = int(info.formula(*args, **kwargs, out_val=out))
                if key is not None and len(info.answers) < MAX_ANSWERS:
                    info.answers[key] = n
            first = _first_tensor(args, tensor)
            on_gpu = first is not None and not first.is_cpu
            how = (first.dtype if first is not None else None, on_gpu, info.kind)
            precision = self.precisions.get(how)
            if precision is None:
                dtype = str(first.dtype).removeprefix("torch.") if first is not None else ""
                precision = self.precisions[how] = _precision_of(dtype, on_gpu, info.kind, self.tf32)
            self.flops += n
            self.gpu_flops += n if on_gpu else 0
            self.by_precision[precision] = self.by_precision.get(precision, 0) + n
            self.by_op[info.name] = self.by_op.get(info.name, 0) + n

    _MODE_CLASSES[id(torch)] = StepCountingMode
    return StepCountingMode


def _skip_in_dynamo(fn: Any) -> bool:
    """Mark ``fn``'s code so that Dynamo neither traces it nor anything it calls; False when
    this torch has no such mark (its own per-call wrapper is used then)."""
    try:
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy

        set_code_exec_strategy(fn.__code__, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))
    except Exception:  # another torch: keep torch's wrapper
        return False
    return True


def _compiled_code_would_change(torch: Any) -> bool:
    """True on a torch whose dispatch modes cannot declare ``ignore_compile_internals`` (so
    Dynamo would run compiled code uncompiled under the counter) once compiled code ran here."""
    from torch.utils._python_dispatch import TorchDispatchMode

    if hasattr(TorchDispatchMode, "ignore_compile_internals"):
        return False
    utils = sys.modules.get("torch._dynamo.utils")
    stats = getattr(utils, "counters", {}).get("stats", {}) if utils is not None else {}
    return bool(stats.get("unique_graphs"))


def _tf32_flags(torch: Any) -> dict[str, bool]:
    flags = {"matmul": False, "conv": False}
    try:
        flags["matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
        flags["conv"] = bool(torch.backends.cudnn.allow_tf32)
    except Exception:  # another torch layout: fp32 stays fp32
        pass
    return flags


class StepFlopCounter:
    """Counts one step: :meth:`begin` at a step's end (the hook), :meth:`end` at the next one."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.mode: Any = None
        self.step: int | None = None
        self.result: FlopCount | None = None
        self.why_not = ""
        self._thread: int | None = None
        self._t0 = 0.0

    def begin(self, step: int) -> bool:
        """Start counting the step that begins now (``step``: its 0-based index)."""
        torch = self.torch
        try:
            if torch._C._len_torch_dispatch_stack():
                # the user's own mode (a FlopCounterMode, a debug mode) is active: pushing ours on
                # top would make their `with` block pop ours instead of theirs when it ends
                self.why_not = "not counted: another dispatch mode (such as FlopCounterMode) was active at step 1's end"
                return False
            if _compiled_code_would_change(torch):
                self.why_not = (f"not counted: torch {torch.__version__} would run this kernel's compiled code "
                                "uncompiled under a counting mode (newer torch versions count compiled steps)")
                return False
            self.mode = _mode_class(torch)(_tf32_flags(torch))
            self.mode.__enter__()
        except Exception as exc:  # an unusual torch: the cell goes on without a count
            self.mode = None
            self.why_not = f"not counted: the counting mode could not start ({type(exc).__name__}: {exc})"
            return False
        self.step = step
        self._thread = threading.get_ident()
        self._t0 = time.perf_counter()
        return True

    def end(self, complete: bool = True) -> None:
        """Stop counting (at the next step's end; ``complete=False``: the cell ended first)."""
        mode, step = self.mode, self.step
        if mode is None or step is None or self.result is not None:  # (begin sets both)
            return
        if mode.inert:  # an earlier end could not take it off the stack: try again (the cell's end)
            if self._leave(mode):
                self.mode = None
            return
        host_ms = (time.perf_counter() - self._t0) * 1000.0
        if not self._leave(mode):
            mode.inert = True  # still on the stack of another thread or under a user's mode: only passes calls on
            self.why_not = ("not counted: the step ended in another thread or inside another dispatch mode, "
                            "so the counting mode was switched off instead of removed")
            return
        self.mode = None  # off the stack
        if not complete:
            self.why_not = (f"not counted: the cell ended before step {step + 1} finished "
                            "(FLOPs are counted on the second optimizer step)")
            return
        notes = []
        if mode.hops:
            notes.append(f"{mode.hops} higher-order operations (compiled regions, cond) ran uncounted")
        if mode.failures:
            notes.append(f"{mode.failures} operations could not be counted ({mode.first_failure})")
        self.result = FlopCount(step, mode.flops, dict(mode.by_precision), dict(mode.by_op), mode.bytes,
                                mode.ops, host_ms, "; ".join(notes), mode.gpu_flops)

    def _leave(self, mode: Any) -> bool:
        if threading.get_ident() != self._thread:
            return False
        try:
            from torch.utils._python_dispatch import _get_current_dispatch_mode

            current = _get_current_dispatch_mode()
            if current is None or current is not mode:
                return False
            current.__exit__(None, None, None)
            return True
        except Exception:
            return False
