"""What limited a profiled cell, and what to do about it, from its measurements only.

Shares are of the training loop's time (first batch to last optimizer step). Thresholds:
a cause is named when it took at least 20 % of the loop (the removed TensorBoard profiler
plugin flagged DataLoader time above 5 %; we advise from 5 % and give a verdict from 20 %).

Host syncs: a sync every step serialises the CPU and the GPU. Removing it lets them overlap,
so the time it can give back is about min(host work, GPU wait) per step (LANfactory PR #120:
"the recovered time is min(CPU, GPU) per step").
"""

from __future__ import annotations

import os

from gpunb.analysis.advice import Advice, ranked
from gpunb.analysis.gpu_specs import peak_for
from gpunb.analysis.profile.records import CellProfile, Verdict
from gpunb.analysis.profile.throughput import throughput_advice
from gpunb.analysis.torch_wheels import install_command

VERDICT_SHARE = 0.20
ADVICE_SHARE = 0.05
MEMORY_CEILING = 0.95  # peak reserved / device total



def more_workers(workers: int, cores: int) -> int | None:
    """The DataLoader workers worth trying next on ``cores`` cores: double the current ones,
    at most 8 and at most one fewer than the cores (the training loop keeps one); None when
    that is no more than ``workers`` already runs (advice never repeats the current value)."""
    fits = max(1, min(8, cores - 1))
    more = min(fits, max(1, workers * 2))
    return more if more > workers else None

def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def sync_gain(p: CellProfile) -> float:
    """Share of the loop that removing per-step GPU syncs could give back (0 on CPU)."""
    s = p.shares
    steps = max(p.steps.count, 1)
    if p.gpu is None or s.sync_gpu_n < 0.5 * steps or s.loop_s <= 0:
        return 0.0
    wait = s.sync_gpu_s
    host = max(s.loop_s - wait - s.data_wait_s - s.output_s, 0.0)
    return min(host, wait) / s.loop_s


def judge(p: CellProfile) -> tuple[Verdict, list[Advice]]:
    """The verdict on a measured cell and its advice, most useful first."""
    s = p.shares
    data, output, syncs = s.share(s.data_wait_s), s.share(s.output_s), sync_gain(p)
    advice: list[Advice] = []
    gpu = p.gpu
    steps = p.steps.count

    # -- advice for every measured cost, verdict or not -------------------------------------
    if data >= ADVICE_SHARE and s.batches:
        workers = s.loader_workers or 0
        cores = os.cpu_count() or 1
        more = more_workers(workers, cores)
        if more is None:  # every core but the training loop's already loads data: more workers cannot help
            title = f"Make each batch cheaper: {workers} DataLoader workers already use this machine's {cores} cores"
            how = "cache decoded/preprocessed samples, or move augmentation to the GPU"
        elif not workers:
            title = "Load batches in worker processes"
            how = f"DataLoader(..., num_workers={more}, persistent_workers=True)"
        else:
            title = f"Use more DataLoader workers: {more} on this machine's {cores} cores (now {workers})"
            how = f"DataLoader(..., num_workers={more})"
        advice.append(Advice(title, f"the loop waited {s.data_wait_s:.2f} s ({_pct(data)}) for {s.batches} batches",
                             how, gain=data))
        if gpu is not None and s.loader_pin_memory is False:
            advice.append(Advice("Pin host memory for faster copies to the GPU",
                                 "batches come from pageable memory (pin_memory=False)",
                                 "DataLoader(..., pin_memory=True); batch.to('cuda', non_blocking=True)"))
        advice.append(Advice("Do expensive per-sample work once, or on the GPU",
                             f"{1000 * s.data_wait_s / max(s.batches, 1):.1f} ms per batch in the DataLoader",
                             "cache decoded/preprocessed samples; move augmentation to the GPU", severity=0))
    if syncs >= ADVICE_SHARE:
        methods = ", ".join(f".{m}() x{n}" for m, n in sorted(s.sync_by_method.items(), key=lambda kv: -kv[1]))
        advice.append(Advice("Read values back from the GPU less often",
                             f"{s.sync_gpu_n} host syncs ({methods}) waited {s.sync_gpu_s:.2f} s; "
                             f"without them the CPU could run ahead of the GPU",
                             "keep `running += loss.detach()` on the GPU and call .item() every 50 steps",
                             gain=syncs))
    if output >= ADVICE_SHARE:
        advice.append(Advice("Print/log less often",
                             f"{s.output_writes} writes ({s.output_chars:,} characters) took {s.output_s:.2f} s "
                             f"({_pct(output)})",
                             "log every N steps; keep per-step values in a list and show a summary", gain=output))

    on_cpu = bool(p.gpu_visible) and steps > 0 and p.param_devices == ("cpu",)
    total = gpu.total_bytes if gpu else None
    peak_res = gpu.peak_reserved_bytes if gpu else None
    at_ceiling = bool(gpu and total and peak_res and peak_res / total >= MEMORY_CEILING)
    retries = gpu.alloc_retries if gpu else 0
    fp32 = "float32" in p.param_dtypes
    cc = gpu.compute_capability if gpu else None
    ampere_plus = bool(cc and cc >= (8, 0))
    peak = peak_for(gpu.name) if gpu else None

    if on_cpu:
        if not p.torch_cuda:
            advice.append(Advice("Install a CUDA build of torch",
                                 f"NVML sees {p.gpu_visible}, but torch {p.torch_version} is a CPU-only build",
                                 install_command(p.driver_cuda),
                                 severity=2))
        else:
            advice.append(Advice("Move the model and each batch to the GPU",
                                 f"the optimizer's {p.param_count:,} parameters are on the CPU although NVML sees "
                                 f"an {p.gpu_visible}",
                                 "model.to('cuda') before creating the optimizer; x, y = x.to('cuda'), y.to('cuda')",
                                 severity=2))
    if gpu is not None and (at_ceiling or retries):
        why = (f"{retries} cudaMalloc retries (each flushes the allocator cache)" if retries
               else f"peak reserved {(peak_res or 0) / 2**30:.1f} GiB of {(total or 0) / 2**30:.1f} GiB")
        advice.append(Advice("Use a smaller batch with gradient accumulation", why,
                             "loss = loss / k; loss.backward(); step every k batches"))
        advice.append(Advice("Checkpoint activations", why,
                             "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)"))
        if retries:
            advice.append(Advice("Let the allocator grow segments instead of fragmenting", why,
                                 "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set before CUDA starts)"))
    flops = p.flops
    count = flops.count if flops is not None else None
    mix = dict(count.precision_mix()) if count is not None else None
    low_precision = mix is not None and mix.get("bf16", 0) + mix.get("fp16", 0) + mix.get("fp8", 0) >= 0.5
    # (ampere_plus implies a compute capability)
    if gpu is not None and fp32 and ampere_plus and cc is not None and not low_precision:  # no autocast seen
        ratio = peak.bf16_tflops / peak.tf32_tflops if peak and peak.bf16_tflops and peak.tf32_tflops else None
        if mix and flops is not None and count is not None:
            fp32_share = mix.get("fp32", 0) + mix.get("tf32", 0)
            mfu = f" at {100 * flops.mfu:.0f}% MFU" if flops.mfu is not None else ""
            why = (f"{100 * fp32_share:.0f}% of step {count.step + 1}'s FLOPs ran in fp32/TF32{mfu} "
                   f"on {gpu.name}")
            title = "Train in bf16 with autocast"
        else:
            why = f"parameters are float32 on {gpu.name}"
            title = "Train in bf16 with autocast (skip if you already do)"
        advice.append(Advice(title,
                             f"{why} (compute capability {cc[0]}.{cc[1]}), whose bf16 "
                             "tensor cores are the fastest path" + (f" ({ratio:.0f}x its TF32 peak)" if ratio else "")
                             + "; activations also take half the memory",
                             "with torch.autocast('cuda', dtype=torch.bfloat16): loss = model(x)"))
        if p.matmul_precision == "highest":
            advice.append(Advice("Allow TF32 for float32 matmuls",
                                 f"float32 matmul precision is 'highest' on a compute capability {cc[0]}.{cc[1]} GPU",
                                 "torch.set_float32_matmul_precision('high')"))

    # -- the verdict ---------------------------------------------------------------------------
    if steps == 0 and s.batches == 0:
        verdict = Verdict("none", "no training loop seen",
                          "no optimizer.step() call and no DataLoader batch in this cell")
    elif on_cpu:
        verdict = Verdict("on-cpu", "training on the CPU although a GPU is available",
                          next(a.reason for a in advice if a.severity == 2))
    elif gpu is not None and (at_ceiling or retries):
        verdict = Verdict("memory-bound", "at the GPU memory limit",
                          next(a.reason for a in advice if a.title.startswith("Use a smaller batch")))
    else:
        causes = [(data, "input-bound", "waiting for data",
                   f"{_pct(data)} of the loop waited for the next DataLoader batch"),
                  (syncs, "sync-bound", "host syncs serialise CPU and GPU",
                   f"{s.sync_gpu_n} GPU->host syncs; removing them could save about {_pct(syncs)} of the loop"),
                  (output, "output-bound", "busy writing output",
                   f"{_pct(output)} of the loop went to writing output")]
        share, kind, headline, reason = max(causes, key=lambda c: c[0])
        if share >= VERDICT_SHARE:
            verdict = Verdict(kind, headline, reason)
        elif gpu is None:
            # No GPU took part. "compute-bound" (green: the GPU is the limit) would praise a loop that
            # had no GPU to keep busy, and on the CPU loading and computing share the same cores.
            where = p.gpu_absent or "no GPU"
            verdict = Verdict("cpu-only", "trained on the CPU",
                              f"no GPU in this cell ({where}); of the loop, data wait took {_pct(data)}, "
                              f"output {_pct(output)}, the rest computing")
        elif gpu.util_mean_pct is not None and gpu.util_mean_pct < 50:
            verdict = Verdict("host-bound", "the GPU waits for Python",
                              f"GPU busy only {gpu.util_mean_pct:.0f}% of the time with no data or sync wait: "
                              "small kernels launched one by one from Python")
            advice.append(Advice("Give the GPU bigger pieces of work",
                                 verdict.reason, "a larger batch; model = torch.compile(model)", gain=None))
        else:
            util = f"GPU busy {gpu.util_mean_pct:.0f}% of the time" if gpu.util_mean_pct is not None else \
                "no data, sync or output wait"
            verdict = Verdict("compute-bound", "the GPU is the limit", util)
            if total and peak_res and peak_res / total < 0.5:
                advice.append(Advice("Try a larger batch",
                                     f"peak reserved {peak_res / 2**30:.1f} GiB of {total / 2**30:.1f} GiB",
                                     "double the batch size (and scale the learning rate)"))
    advice += throughput_advice(p.flops, p.ops, verdict.kind)
    return verdict, ranked(advice)
