"""Record what a multi-GPU machine really says, for gpunb's fake NVML and its multi-GPU design.

Run on the GPU machine (never in CI): ``python3 scripts/record_multi_gpu.py --out DIR``.
Writes ``DIR/multi_gpu_record.json`` with, per section (each section survives the others' failures):

- ``nvml``: every GPU's static facts (the keys of ``gpunb/testing/h200_trace.json``'s ``facts``) plus
  NVLink per link (state, version, remote bus id, remote device type, P2P capability), NVLink field
  values, P2P status and topology for each pair;
- ``trace``: NVML samples of both GPUs at ~5 Hz while two DDP ranks train (balanced, then rank 1 idle),
  with the process lists and NVLink throughput counters;
- ``fork``: which torch calls leave a forked child unable to use CUDA (``_cuda_isInBadFork``);
- ``nccl``: all-reduce bus bandwidth as nccl-tests define it (busbw = algbw * 2(n-1)/n) and a
  peer-to-peer copy;
- ``cuda_order``: torch's device UUIDs under several ``CUDA_VISIBLE_DEVICES`` values;
- ``timing``: ``import torch; torch.ones(1, device='cuda')`` in fresh interpreters.

NVLink multicast stays off everywhere (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1): it can take a shared host's GPUs out of service.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NO_MULTICAST)


def nvml_value(fn, *args):
    import pynvml

    try:
        v = fn(*args)
    except pynvml.NVMLError as exc:
        return {"nvml_error": str(exc), "code": getattr(exc, "value", None)}
    except Exception as exc:  # noqa: BLE001 (record anything)
        return {"error": repr(exc)}
    if isinstance(v, bytes):
        v = v.decode(errors="replace")
    return v


def field_values(h, ids):
    import pynvml

    try:
        got = pynvml.nvmlDeviceGetFieldValues(h, ids)
    except pynvml.NVMLError as exc:
        return {"nvml_error": str(exc)}
    out = {}
    for fid, v in zip(ids, got):
        key = str(fid if isinstance(fid, int) else f"{fid[0]}:{fid[1]}")
        if v.nvmlReturn != 0:
            out[key] = {"nvml_return": int(v.nvmlReturn)}
            continue
        vt = int(v.valueType)
        val = {0: v.value.dVal, 1: v.value.uiVal, 2: v.value.ulVal, 3: v.value.ullVal, 4: v.value.sllVal,
               5: v.value.siVal, 6: v.value.usVal}.get(vt, v.value.ullVal)
        out[key] = {"value": val, "type": vt, "timestamp": int(v.timestamp)}
    return out


def record_nvml():
    import pynvml as n

    n.nvmlInit()
    count = n.nvmlDeviceGetCount()
    handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    gpus = []
    for h in handles:
        mem = nvml_value(n.nvmlDeviceGetMemoryInfo, h, n.nvmlMemory_v2)
        pci = nvml_value(n.nvmlDeviceGetPciInfo, h)
        facts = {
            "name": nvml_value(n.nvmlDeviceGetName, h),
            "uuid": nvml_value(n.nvmlDeviceGetUUID, h),
            "pci_bus_id": pci.busId.decode() if hasattr(pci, "busId") and isinstance(pci.busId, bytes)
            else getattr(pci, "busId", pci),
            "memory_total": getattr(mem, "total", mem),
            "memory_reserved": getattr(mem, "reserved", None),
            "cuda_compute_capability": list(nvml_value(n.nvmlDeviceGetCudaComputeCapability, h)),
            "power_limit_mw": nvml_value(n.nvmlDeviceGetEnforcedPowerLimit, h),
            "max_sm_clock_mhz": nvml_value(n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_SM),
            "max_mem_clock_mhz": nvml_value(n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_MEM),
            "pcie_gen_current": nvml_value(n.nvmlDeviceGetCurrPcieLinkGeneration, h),
            "pcie_gen_max": nvml_value(n.nvmlDeviceGetMaxPcieLinkGeneration, h),
            "pcie_width_current": nvml_value(n.nvmlDeviceGetCurrPcieLinkWidth, h),
            "pcie_width_max": nvml_value(n.nvmlDeviceGetMaxPcieLinkWidth, h),
            "persistence_mode": nvml_value(n.nvmlDeviceGetPersistenceMode, h),
            "compute_mode": nvml_value(n.nvmlDeviceGetComputeMode, h),
            "ecc_mode": list(nvml_value(n.nvmlDeviceGetEccMode, h)) if not isinstance(
                nvml_value(n.nvmlDeviceGetEccMode, h), dict) else nvml_value(n.nvmlDeviceGetEccMode, h),
            "mig_mode": nvml_value(n.nvmlDeviceGetMigMode, h),
            "temp_slowdown_c": nvml_value(n.nvmlDeviceGetTemperatureThreshold, h,
                                          n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            "temp_shutdown_c": nvml_value(n.nvmlDeviceGetTemperatureThreshold, h,
                                          n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
            "ecc_uncorrected_volatile": nvml_value(n.nvmlDeviceGetTotalEccErrors, h,
                                                   n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
            "numa_node": nvml_value(getattr(n, "nvmlDeviceGetNumaNodeId", lambda h: None), h),
            "minor_number": nvml_value(n.nvmlDeviceGetMinorNumber, h),
        }
        if isinstance(facts["mig_mode"], (list, tuple)):
            facts["mig_mode"] = list(facts["mig_mode"])
        links = []
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            state = nvml_value(n.nvmlDeviceGetNvLinkState, h, link)
            if isinstance(state, dict) and link >= 18:
                continue
            remote = nvml_value(n.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            links.append({
                "link": link,
                "state": state,
                "version": nvml_value(n.nvmlDeviceGetNvLinkVersion, h, link),
                "remote_bus_id": (remote.busId.decode() if isinstance(getattr(remote, "busId", None), bytes)
                                  else getattr(remote, "busId", remote)),
                "remote_device_type": nvml_value(n.nvmlDeviceGetNvLinkRemoteDeviceType, h, link),
                "cap_p2p": nvml_value(n.nvmlDeviceGetNvLinkCapability, h, link, n.NVML_NVLINK_CAP_P2P_SUPPORTED),
            })
        facts["nvlinks"] = links
        facts["nvlink_fields"] = field_values(h, [90, 91, 138, 139, 140, 141, 164, 165, 166])
        gpus.append(facts)
    pairs = []
    for i in range(count):
        for j in range(count):
            if i == j:
                continue
            pairs.append({
                "a": i, "b": j,
                "p2p": {name: nvml_value(n.nvmlDeviceGetP2PStatus, handles[i], handles[j], idx)
                        for name, idx in (("read", 0), ("write", 1), ("nvlink", 2), ("atomics", 3), ("prop", 4))},
                "topology_common_ancestor": nvml_value(n.nvmlDeviceGetTopologyCommonAncestor, handles[i], handles[j]),
            })
    return {
        "driver_version": nvml_value(n.nvmlSystemGetDriverVersion),
        "cuda_driver_version": nvml_value(n.nvmlSystemGetCudaDriverVersion),
        "nvml_version": nvml_value(n.nvmlSystemGetNVMLVersion),
        "device_count": count,
        "gpus": gpus,
        "pairs": pairs,
    }


def sample_all(t0, handles):
    import pynvml as n

    rows = []
    for i, h in enumerate(handles):
        mem = nvml_value(n.nvmlDeviceGetMemoryInfo, h, n.nvmlMemory_v2)
        util = nvml_value(n.nvmlDeviceGetUtilizationRates, h)
        procs = nvml_value(n.nvmlDeviceGetComputeRunningProcesses, h)
        rows.append({
            "index": i,
            "t": round(time.monotonic() - t0, 3),
            "memory_used": getattr(mem, "used", None),
            "memory_free": getattr(mem, "free", None),
            "util_gpu": getattr(util, "gpu", None),
            "util_memory": getattr(util, "memory", None),
            "power_mw": nvml_value(n.nvmlDeviceGetPowerUsage, h),
            "temp_c": nvml_value(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
            "sm_clock_mhz": nvml_value(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
            "mem_clock_mhz": nvml_value(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM),
            "clocks_event_reasons": nvml_value(n.nvmlDeviceGetCurrentClocksEventReasons, h),
            "pstate": nvml_value(n.nvmlDeviceGetPerformanceState, h),
            "processes": [{"pid": p.pid, "used_gpu_memory": p.usedGpuMemory} for p in procs]
            if isinstance(procs, list) else procs,
            "nvlink_tx_rx_kib": field_values(h, [138, 139]),
        })
    return rows


DDP_WORKER = textwrap.dedent("""
    import os, sys, time, json, datetime
    import torch, torch.distributed as dist
    rank = int(os.environ["RANK"]); world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=120))
    phase_s = float(sys.argv[1])
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(6)]).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    x = torch.randn(512, 4096, device="cuda")
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = ddp(x).float().pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    def train(seconds):
        # every rank must run the same number of steps (each backward is an all-reduce): time
        # 5 steps on rank 0, agree on the count, then run exactly that many
        for _ in range(3):
            step()
        torch.cuda.synchronize(); t = time.time()
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        n = torch.tensor([max(1, int(seconds / ((time.time() - t) / 5)))], device="cuda")
        dist.broadcast(n, 0)
        for _ in range(int(n.item())):
            step()
        torch.cuda.synchronize(); return int(n.item())
    marks = {}
    dist.barrier(); marks["balanced_start"] = time.time()
    n_bal = train(phase_s)
    dist.barrier(); marks["unbalanced_start"] = time.time()
    # rank 0 keeps computing alone (no collectives), rank 1 idles: an unbalanced pair as NVML sees it
    if rank == 0:
        end = time.time() + phase_s
        with torch.no_grad():
            while time.time() < end:
                model(x)
        torch.cuda.synchronize()
    else:
        time.sleep(phase_s)
    dist.barrier(); marks["end"] = time.time()
    if rank == 0:
        print(json.dumps({"steps_balanced": n_bal, "marks": marks}), flush=True)
    dist.destroy_process_group()
""")


def record_trace(out_dir, phase_s=4.0):
    import pynvml as n

    n.nvmlInit()
    handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
    script = os.path.join(out_dir, "_ddp_worker.py")
    with open(script, "w") as f:
        f.write(DDP_WORKER)
    t0 = time.monotonic()
    wall0 = time.time()
    rows = []
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            rows.extend(sample_all(t0, handles))
            stop.wait(0.2)

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    time.sleep(1.0)
    env = dict(os.environ, OMP_NUM_THREADS="1", **NO_MULTICAST)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={len(handles)}", script, str(phase_s)],
                          capture_output=True, text=True, env=env, timeout=180)
    time.sleep(1.0)
    stop.set()
    th.join()
    info = None
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            info = json.loads(line)
    return {"wall0": wall0, "rows": rows, "ddp": info, "rc": proc.returncode,
            "stderr_tail": proc.stderr[-3000:]}


NCCL_WORKER = textwrap.dedent("""
    import os, json, time, datetime
    import torch, torch.distributed as dist
    rank = int(os.environ["RANK"]); world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=120))
    res = []
    for mib in (8, 64, 256, 1024):
        n = mib * 2**20 // 4
        x = torch.full((n,), float(rank + 1), device="cuda")
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize(); dist.barrier()
        x.fill_(float(rank + 1))
        iters = 20
        start = torch.cuda.Event(enable_timing=True); end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(x)
        end.record(); torch.cuda.synchronize()
        ms = start.elapsed_time(end) / iters
        ok = None
        y = torch.full((16,), float(rank + 1), device="cuda"); dist.all_reduce(y)
        ok = bool((y == world * (world + 1) / 2).all().item())
        algbw = (n * 4) / (ms / 1e3) / 1e9
        res.append({"bytes": n * 4, "ms": ms, "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (world - 1) / world,
                    "sum_ok": ok})
    if rank == 0:
        print(json.dumps(res), flush=True)
    dist.destroy_process_group()
""")


def record_nccl(out_dir):
    script = os.path.join(out_dir, "_nccl_worker.py")
    with open(script, "w") as f:
        f.write(NCCL_WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1", **NO_MULTICAST)
    t = time.perf_counter()
    import torch  # noqa: F401 (count only)

    n = int(subprocess.run([sys.executable, "-c", "import pynvml as n; n.nvmlInit(); print(n.nvmlDeviceGetCount())"],
                           capture_output=True, text=True).stdout.strip() or 0)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
                           script], capture_output=True, text=True, env=env, timeout=180)
    result = {"rc": proc.returncode, "wall_s": time.perf_counter() - t, "stderr_tail": proc.stderr[-2000:]}
    for line in proc.stdout.splitlines():
        if line.startswith("["):
            result["allreduce"] = json.loads(line)
    p2p = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import torch, json
        a = torch.empty(1 << 28, dtype=torch.uint8, device="cuda:0")
        b = torch.empty_like(a, device="cuda:1")
        print(json.dumps({"can_access_peer": torch.cuda.can_device_access_peer(0, 1)}))
        for _ in range(3): b.copy_(a)
        torch.cuda.synchronize()
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(20): b.copy_(a)
        e.record(); torch.cuda.synchronize()
        print(json.dumps({"p2p_copy_gbs": a.numel() * 20 / (s.elapsed_time(e) / 1e3) / 1e9}))
    """)], capture_output=True, text=True, env=env, timeout=120)
    result["p2p"] = [json.loads(line) for line in p2p.stdout.splitlines() if line.startswith("{")]
    result["p2p_stderr"] = p2p.stderr[-1000:]
    return result


FORK_PROBE = textwrap.dedent("""
    import os, sys, json
    call = sys.argv[1]
    import torch
    err = None
    try:
        exec(call)
    except Exception as exc:
        err = repr(exc)[:300]
    init = torch.cuda.is_initialized()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        res = {}
        try:
            os.close(r)
            res["bad_fork"] = bool(torch._C._cuda_isInBadFork())
            torch.ones(1, device="cuda"); torch.cuda.synchronize(); res["child_cuda"] = "ok"
        except BaseException as exc:
            res["child_cuda"] = repr(exc)[:200]
        finally:
            os.write(w, json.dumps(res).encode()); os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk: break
        data += chunk
    os.waitpid(pid, 0)
    print(json.dumps({"call": call, "error": err, "parent_initialized": init, **json.loads(data or b"{}")}))
""")

FORK_CALLS = [
    "pass",
    "torch.cuda.is_initialized()",
    "torch.version.cuda",
    "torch.cuda.is_available()",
    "os.environ['PYTORCH_NVML_BASED_CUDA_CHECK']='1'; torch.cuda.is_available()",
    "torch.cuda.device_count()",
    "os.environ['PYTORCH_NVML_BASED_CUDA_CHECK']='1'; torch.cuda.device_count()",
    "torch._C._cuda_getDeviceCount()",
    "torch._C._cuda_getArchFlags()",
    "torch.cuda.get_arch_list()",
    "torch.backends.cudnn.version()",
    "torch.backends.cudnn.is_available()",
    "torch.cuda.nccl.version()",
    "torch.get_float32_matmul_precision()",
    "torch.backends.cuda.matmul.allow_tf32",
    "torch.cuda.is_bf16_supported()",
    "torch.cuda.get_device_capability(0)",
    "torch.cuda.get_device_properties(0)",
    "torch.cuda.memory_stats(0)",
    "torch.cuda.memory_allocated(0)",
    "torch.cuda.mem_get_info(0)",
    "torch.cuda.get_per_process_memory_fraction(0)",
    "torch._C._cuda_memoryStats(0)",
    "torch.cuda.current_device()",
    "torch.cuda.memory._record_memory_history(max_entries=10)",
    "import torch.optim; torch.optim.optimizer.register_optimizer_step_post_hook(lambda *a: None)",
    "torch.cuda.Event(enable_timing=True)",
    "torch.cuda.current_stream()",
    "from torch.utils.flop_counter import FlopCounterMode; FlopCounterMode(display=False)",
    # gpunb as it stood before the fork-safety work (issue 10): the bisected culprit and its neighbours
    "import gpunb; gpunb.check(quick=True)",
    "import gpunb; gpunb.memory()",
]


def record_fork():
    env = dict(os.environ)
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)

    def one(call):
        p = subprocess.run([sys.executable, "-c", FORK_PROBE, call], capture_output=True, text=True, env=env,
                           timeout=120)
        lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else {"call": call, "rc": p.returncode, "stderr": p.stderr[-500:]}

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, FORK_CALLS))


def record_cuda_order():
    out = {}
    code = ("import torch, json; print(json.dumps([str(torch.cuda.get_device_properties(i).uuid) "
            "for i in range(torch.cuda.device_count())]))")
    for cvd in (None, "1,0", "1", "0,1"):
        env = dict(os.environ)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if cvd is not None:
            env["CUDA_VISIBLE_DEVICES"] = cvd
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        out[str(cvd)] = p.stdout.strip() or p.stderr[-300:]
    return out


def record_timing(repeats=3):
    res = {}
    for name, code in (("import_torch", "import torch"),
                       ("torch_ones_cuda", "import torch; torch.ones(1, device='cuda')"),
                       ("gpunb_check_full", "import sys, gpunb.cli; gpunb.cli.main(['check', '--json'])")):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            p = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
            times.append(time.perf_counter() - t)
            if p.returncode not in (0, 1):
                res[name + "_error"] = p.stderr[-500:]
        res[name] = times
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", default="nvml,cuda_order,fork,nccl,trace,timing")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    record = {"recorded": time.strftime("%Y-%m-%d %H:%M:%S"), "python": sys.version.split()[0]}
    try:
        import torch

        record["torch"] = torch.__version__
    except Exception as exc:  # noqa: BLE001
        record["torch"] = repr(exc)
    for key, cmd in (("nvidia_smi_topo", ["nvidia-smi", "topo", "-m"]),
                     ("nvidia_smi_nvlink", ["nvidia-smi", "nvlink", "-s"])):
        try:
            smi = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            record[key] = (smi.stdout + smi.stderr)[-6000:]
        except (OSError, subprocess.TimeoutExpired) as exc:
            record[key] = repr(exc)
    sections = {"nvml": lambda: record_nvml(), "cuda_order": record_cuda_order, "fork": record_fork,
                "nccl": lambda: record_nccl(args.out), "trace": lambda: record_trace(args.out),
                "timing": record_timing}
    for name in args.sections.split(","):
        t = time.perf_counter()
        try:
            record[name] = sections[name]()
        except Exception:  # noqa: BLE001 (one failed section must not lose the others)
            import traceback

            record[name] = {"failed": traceback.format_exc()[-3000:]}
        print(f"{name}: {time.perf_counter() - t:.1f} s", flush=True)
        with open(os.path.join(args.out, "multi_gpu_record.json"), "w") as f:
            json.dump(record, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
