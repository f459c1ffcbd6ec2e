"""Checks of several GPUs together: how each pair is joined, and an all-reduce across them.

``gpu_links`` reads NVML only (NVLink links and speed, the PCIe path, peer-to-peer status), so
it is in every tier. ``nccl_allreduce`` is the deep tier (``--deep``): one process per GPU runs
NCCL's all-reduce, checks every element of the sum and measures the bus bandwidth as nccl-tests
defines it, which is compared with what the slowest link between the GPUs should carry.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpunb.analysis.checks.inputs import CheckInputs
from gpunb.analysis.checks.records import CheckResult, Status, worst
from gpunb.analysis.gpu_specs import pcie_gbps
from gpunb.readings.links import NVLINK_VERSION, PairLink
from gpunb.readings.nvml import is_available

NCCL_TESTS_DOC = "https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md"
TOPO_DOC = "https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html"
NCCL_ENV_DOC = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"

# busbw below this share of what the link carries means NCCL is not using the link as it
# should. On the H200 pair (NV18 through an NVSwitch) 2 ranks reached 61 % at 256 MiB and
# 68 % at 1 GiB (benchmarks/results/h200x2_record.json); nccl-tests' large messages usually
# land between 60 and 85 % of the link rate.
LOW_SHARE = 0.30

HANG_ADVICE = (
    "When a real run hangs: set NCCL_DEBUG=INFO before it starts (NCCL logs the transport it picked and where it "
    "stops); try NCCL_P2P_DISABLE=1 once (slower, but if the run then works, peer-to-peer is the problem: "
    "IOMMU/ACS settings or the PCIe topology); pass init_process_group(timeout=datetime.timedelta(minutes=5)) so "
    "that a hang becomes an error with a stack trace; and give every rank the same number of batches "
    "(DistributedSampler, drop_last=True, or the Join context manager): a rank that runs out of data leaves the "
    "others waiting in an all-reduce forever."
)


def size_text(n_bytes: int) -> str:
    """A message size as nccl-tests' tables give it: 8 MiB, 1 GiB."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= size:
            return f"{n_bytes / size:g} {unit}"
    return f"{n_bytes} B"


def _gpu_names(indices: Iterable[int]) -> str:
    return "↔".join(f"GPU{i}" for i in indices)


def pair_gbps(inputs: CheckInputs, pair: PairLink) -> tuple[float | None, str]:
    """What one direction of the pair's link carries, and what that figure is based on."""
    if pair.nvlinks and pair.nvlink_gbps:
        speed = pair.nvlink_gbps / pair.nvlinks
        via = " through NVSwitch" if pair.via_switch else ""
        return pair.nvlink_gbps, (f"{pair.nvlinks} NVLink links{via} × {speed:.1f} GB/s per direction, "
                                  "from NVML's link count and link speed")
    rates = []
    for index in (pair.a, pair.b):
        s = inputs.sample(index)
        g = next((g for g in inputs.snapshot.gpus if g.index == index), None)
        gen, width = s.pcie_gen, s.pcie_width
        if not is_available(gen) or not is_available(width):
            gen, width = (g.pcie_gen_max, g.pcie_width_max) if g is not None else (gen, width)
        rate = pcie_gbps(gen, width) if is_available(gen) and is_available(width) else None
        if rate:
            rates.append((rate, gen, width))
    if not rates:
        return None, "PCIe link unknown"
    rate, gen, width = min(rates)
    return rate, f"PCIe gen{gen} x{width}, {rate:.0f} GB/s per direction, NVML's current link"


def _pair_line(inputs: CheckInputs, pair: PairLink) -> tuple[Status, str, str, str]:
    """(status, text, cause, fix) of one pair."""
    name = _gpu_names((pair.a, pair.b))
    peer = {k: pair.p2p_ok(k) for k in ("read", "write", "atomics")}
    if pair.nvlinks:
        gpu_a = inputs.links.gpu(pair.a) if inputs.links else None
        version = NVLINK_VERSION.get(gpu_a.version, "") if gpu_a is not None and gpu_a.version else ""
        gbps, _ = pair_gbps(inputs, pair)
        links = [g for g in (inputs.links.gpus if inputs.links else ()) if g.index in (pair.a, pair.b)]
        of = max((g.link_count for g in links), default=0)
        count = f"{pair.nvlinks}" + (f" of {of}" if of > pair.nvlinks else "")
        text = (f"{name}: NVLink{' ' + version if version else ''} × {count}"
                f"{' through NVSwitch' if pair.via_switch else ' direct'}"
                + (f", {gbps:.0f} GB/s per direction" if gbps else ""))
    else:
        text = f"{name}: PCIe, {pair.topology_name} ({pair.topology_words})"
    if all(v is True for v in peer.values()):
        text += "; peer access ok (read, write, atomics)"
    elif peer["read"] is True and peer["write"] is True:
        text += "; peer access ok (read, write; no atomics)"
    else:
        text += f"; peer access {pair.p2p_words('read')}"
    status: Status = "ok"
    cause = fix = ""
    down = _inactive_links(inputs, pair)
    if down:
        status = "warn"
        cause = (f"{name}: {down} NVLink link(s) of these GPUs are down: the GPUs talk over fewer links than they "
                 "have, so gradient sync is slower.")
        fix = "`nvidia-smi nvlink -s` shows each link; down links need an administrator (reset or service)."
    elif peer["read"] is False or peer["write"] is False:
        status = "warn"
        cause = (f"{name}: the GPUs cannot read each other's memory ({pair.p2p_words('read')}): NCCL then copies "
                 "through host memory, and every gradient all-reduce is slower.")
        fix = ("Keep a job on GPUs that share a PCIe switch (`nvidia-smi topo -m`: PIX/PXB); if the hardware "
               "allows peer access, check IOMMU/ACS settings with the administrator.")
    return status, text, cause, fix


def _inactive_links(inputs: CheckInputs, pair: PairLink) -> int:
    """Links of the pair's GPUs that are down where all should be up: on an NVSwitch board every
    link of a GPU goes to a switch. (Bridged cards may leave links unused: those are reported in
    the link count, not judged.)"""
    if inputs.links is None or not pair.via_switch:
        return 0
    return sum(len([p for p in g.ports if not p.active and is_available(p.version)])
               for g in inputs.links.gpus if g.index in (pair.a, pair.b))


def check_gpu_links(inputs: CheckInputs) -> CheckResult:
    title = "How the GPUs are joined: NVLink or PCIe, and peer access"
    if not inputs.snapshot.driver.nvml.ok or len(inputs.gpus) < 2:
        return CheckResult("gpu_links", title, "skip",
                           "one GPU: no link between GPUs to check" if len(inputs.gpus) == 1
                           else "needs two or more GPUs")
    links = inputs.links
    selected = {g.index for g in inputs.gpus}
    pairs = [p for p in (links.pairs if links else ()) if p.a in selected and p.b in selected]
    if not pairs and inputs.links_error:
        return CheckResult("gpu_links", title, "skip", f"gpunb could not read the GPUs' links ({inputs.links_error})",
                           {"error": inputs.links_error}, "This is a gpunb bug, not a finding about the GPUs.",
                           "Please report it with this output; the other checks still ran.")
    if not pairs:
        return CheckResult("gpu_links", title, "skip", "NVML could not read the GPUs' links")
    statuses, parts, causes, fixes = [], [], [], []
    for pair in pairs:
        status, text, cause, fix = _pair_line(inputs, pair)
        statuses.append(status)
        parts.append(text)
        causes += [cause] if cause else []
        fixes += [fix] if fix else []
    measured = {f"gpu{p.a}-gpu{p.b}": {
        "nvlinks": p.nvlinks, "via_switch": p.via_switch, "nvlink_gbps": p.nvlink_gbps,
        "topology": p.topology_name, "p2p": {k: p.p2p_words(k) for k in p.p2p}} for p in pairs}
    tip = ""
    if any(not p.nvlinks for p in pairs):
        tip = ("Over PCIe every DDP step's gradient all-reduce competes with the input pipeline's copies; "
               "large models gain from gradient accumulation with `model.no_sync()` between steps, or bf16 "
               "gradient compression (`ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)`).")
    return CheckResult("gpu_links", title, worst(statuses), "; ".join(parts), measured, " ".join(causes),
                       " ".join(dict.fromkeys(fixes)), TOPO_DOC, tip)


def expected_busbw(inputs: CheckInputs, nvml_indices: list[int]) -> tuple[float | None, str]:
    """What the all-reduce's bus bandwidth can reach: the slowest pair's one-direction rate
    (a ring passes every GPU's link; nccl-tests' busbw is comparable to it)."""
    if inputs.links is None:
        return None, ""
    rated = []
    for i, a in enumerate(nvml_indices):
        for b in nvml_indices[i + 1:]:
            pair = inputs.links.pair(a, b)
            if pair is not None:
                gbps, basis = pair_gbps(inputs, pair)
                if gbps:
                    rated.append((gbps, basis, pair))
    if not rated:
        return None, ""
    gbps, basis, pair = min(rated, key=lambda r: r[0])
    where = "" if len(nvml_indices) == 2 else f"; the slowest pair, {_gpu_names((pair.a, pair.b))}"
    return gbps, basis + where


def _nccl_skip(inputs: CheckInputs, title: str) -> CheckResult | None:
    n = len(inputs.devices.devices)
    if len(inputs.gpus) < 2 or n < 2:
        return CheckResult("nccl_allreduce", title, "skip", "needs two or more GPUs that CUDA sees")
    if not inputs.deep:
        return CheckResult("nccl_allreduce", title, "skip",
                           f"deep tier: `%gpucheck --deep` (or `gpunb.check(deep=True)`) runs an all-reduce across the "
                           f"{n} GPUs, one process each (about 10 s)")
    run = inputs.allreduce
    if run is None:
        if any(g.mig_enabled is True for g in inputs.gpus):
            return CheckResult("nccl_allreduce", title, "skip", "MIG is on: NCCL does not run across MIG instances")
        if not inputs.torch.installed:
            return CheckResult("nccl_allreduce", title, "skip", "torch is not installed")
        return CheckResult("nccl_allreduce", title, "skip", "torch is not a CUDA build (see the torch build check)")
    return None


def check_nccl(inputs: CheckInputs) -> CheckResult:
    title = "NCCL all-reduce across the GPUs (subprocesses)"
    skipped = _nccl_skip(inputs, title)
    run = inputs.allreduce
    if skipped or run is None:
        return skipped or CheckResult("nccl_allreduce", title, "skip", "the all-reduce did not run")
    n = run.world_size
    backend = "NCCL" if run.backend == "nccl" else run.backend
    measured: dict[str, Any] = {
        "backend": run.backend, "world_size": n, "nccl_version": run.nccl_version, "init_ms": run.init_ms,
        "sizes": [s.__dict__ for s in run.sizes], "last_step": run.last_step, "error": run.error}
    if run.error and not run.sizes:
        if run.timed_out:
            return CheckResult("nccl_allreduce", title, "fail", f"{n} ranks did not finish: killed", measured,
                               f"The all-reduce hung: {run.error}.", HANG_ADVICE, NCCL_ENV_DOC)
        return CheckResult("nccl_allreduce", title, "fail", f"{n} ranks: the all-reduce failed", measured,
                           run.error,
                           "Rerun in a terminal with NCCL_DEBUG=INFO to see NCCL's own message. " + HANG_ADVICE,
                           NCCL_ENV_DOC)
    largest = run.largest
    version = f" {run.nccl_version}" if run.nccl_version else ""
    sizes = ", ".join(f"{s.busbw_gbs:.0f} GB/s at {size_text(s.bytes)}" for s in run.sizes)
    summary = f"{n} ranks over {backend}{version}: busbw {sizes}"
    if run.wrong:
        return CheckResult("nccl_allreduce", title, "fail", summary + f"; {run.wrong} element(s) summed wrong",
                           measured, "The GPUs returned wrong sums: data is corrupted between them (a faulty link, "
                           "GPU memory errors or a driver bug).",
                           "Stop training on these GPUs and tell the administrator; `nvidia-smi -q -d ECC` and "
                           "`nvidia-smi nvlink -e` show error counters.", NCCL_TESTS_DOC)
    summary += f"; every element of the sum correct ({len(run.sizes)} sizes)"
    if run.backend != "nccl":
        summary += ("; the recorded fake NVML stands in for the GPUs here, so CPU processes over gloo ran it: "
                    "these are not GPU figures")
        return CheckResult("nccl_allreduce", title, "ok", summary, measured, link=NCCL_TESTS_DOC, tip=HANG_ADVICE)
    expected, basis = expected_busbw(inputs, [d.nvml_index for d in inputs.devices.devices if d.nvml_index is not None])
    measured["expected_gbps"] = expected
    measured["expected_basis"] = basis
    if run.error:  # some sizes measured, then a failure
        return CheckResult("nccl_allreduce", title, "warn", summary, measured,
                           f"The all-reduce stopped early: {run.error}.", HANG_ADVICE, NCCL_ENV_DOC)
    if expected is None or largest is None:
        return CheckResult("nccl_allreduce", title, "ok", summary + " (no link rate to compare with)", measured,
                           link=NCCL_TESTS_DOC, tip=HANG_ADVICE)
    share = largest.busbw_gbs / expected
    measured["share_of_link"] = share
    summary += f"; {share:.0%} of the {expected:.0f} GB/s the link carries: {basis}"
    if share < LOW_SHARE:
        return CheckResult(
            "nccl_allreduce", title, "warn", summary, measured,
            f"At {size_text(largest.bytes)} the all-reduce reached only {share:.0%} of the link's rate: "
            "NCCL is not using the link it should (peer-to-peer disabled, NCCL_P2P_DISABLE/NCCL_P2P_LEVEL set, "
            "IOMMU/ACS), or another job is using these GPUs.",
            "Run with NCCL_DEBUG=INFO and look for the transport NCCL chose ('via P2P/CUMEM', 'via SHM'); compare with "
            "`nvidia-smi topo -m`; check the other-processes check.", NCCL_ENV_DOC, HANG_ADVICE)
    return CheckResult("nccl_allreduce", title, "ok", summary, measured, link=NCCL_TESTS_DOC, tip=HANG_ADVICE)
