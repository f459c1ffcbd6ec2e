"""``CUDA_VISIBLE_DEVICES``: which GPUs a CUDA program in this environment will see.

Rules from the CUDA Programming Guide, "CUDA Environment Variables"
(https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/environment-variables.html):
a comma-separated list of device indices, GPU UUIDs (``GPU-...``, a unique prefix is enough)
or MIG UUIDs (``MIG-...``, or the older ``MIG-GPU-<uuid>/<gi>/<ci>``); the devices are
enumerated in the order of the list; an empty value hides every GPU; parsing stops at the
first invalid entry, so only the entries before it are visible. Indices follow CUDA's
enumeration order, which is fastest-first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (NVML
numbers by PCI bus), so with GPUs of different models an index may name another GPU for
CUDA than for NVML.

Pure: the environment and NVML's GPUs are parameters. The GPUs are any records with
``index``, ``name``, ``uuid``, ``mig_enabled`` and ``mig_devices`` (each with ``uuid``):
:class:`gpunb.readings.gpu.GpuInfo` or :class:`gpunb.readings.devices.GpuIdentity`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpunb.units import shown

# How an entry named its device (``VisibleDevices.how``).
BY_ORDER = "order"  # the variable is unset: every GPU, in enumeration order
BY_INDEX = "index"
BY_UUID = "uuid"
BY_UUID_PREFIX = "uuid prefix"
BY_MIG_UUID = "MIG uuid"


@dataclass(frozen=True)
class VisibleDevices:
    raw: str | None  # None: the variable is not set
    visible: tuple[str, ...]  # UUIDs (GPU- or MIG-) CUDA will see, in CUDA order
    nvml_indices: tuple[int, ...]  # the physical GPUs behind them
    problems: tuple[str, ...] = field(default=())
    notes: tuple[str, ...] = field(default=())
    entries: tuple[str | None, ...] = field(default=())  # the entry naming each visible device (None: unset)
    how: tuple[str, ...] = field(default=())  # BY_* per visible device


def mixed_models(gpus: Sequence[Any]) -> bool:
    """GPUs of more than one model: CUDA's fastest-first order may then differ from NVML's."""
    return len({str(g.name) for g in gpus}) > 1


def bus_order(environ: Mapping[str, str]) -> bool:
    return environ.get("CUDA_DEVICE_ORDER", "").strip().upper() == "PCI_BUS_ID"


def _match_uuid(token: str, gpus: Sequence[Any]) -> tuple[str, int, str] | str | None:
    """The (uuid, nvml index, how) a UUID token names; a string explains an ambiguity."""
    hits = []
    for g in gpus:
        if token.startswith("MIG-GPU-"):  # legacy form MIG-GPU-<parent uuid>/<gi>/<ci>
            if token[4:].split("/")[0] == g.uuid:
                hits.append((token, g.index, BY_MIG_UUID))
            continue
        if isinstance(g.uuid, str) and g.uuid.startswith(token):
            hits.append((g.uuid, g.index, BY_UUID if g.uuid == token else BY_UUID_PREFIX))
        hits += [(mig.uuid, g.index, BY_MIG_UUID) for mig in g.mig_devices if mig.uuid.startswith(token)]
    if len(hits) > 1:
        return f"{shown(token)} matches {len(hits)} devices; give more of the UUID"
    return hits[0] if hits else None


def _resolve_unset(environ: Mapping[str, str], gpus: Sequence[Any]) -> VisibleDevices:
    """CUDA_VISIBLE_DEVICES unset: every GPU whose UUID NVML could read, in NVML's order."""
    uuids = tuple(g.uuid for g in gpus if isinstance(g.uuid, str))
    indices = tuple(g.index for g in gpus if isinstance(g.uuid, str))
    notes: list[str] = []
    if any(g.mig_enabled is True for g in gpus):
        notes.append("MIG is enabled and CUDA_VISIBLE_DEVICES is unset: CUDA enumerates MIG "
                     "instances itself; select one with CUDA_VISIBLE_DEVICES=MIG-<uuid>.")
    if len(gpus) > 1 and mixed_models(gpus) and not bus_order(environ):
        notes.append("GPUs of different models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA numbers them "
                     "fastest-first, NVML by bus id, so cuda:N may not be NVML's GPU N; set "
                     "CUDA_DEVICE_ORDER=PCI_BUS_ID or select GPUs by UUID.")
    unread = [g for g in gpus if not isinstance(g.uuid, str)]
    if unread:  # a lost GPU: CUDA cannot use it either
        why = {g.index: "lost" if getattr(g, "lost", False) else f"its UUID could not be read: {g.uuid}"
               for g in unread}
        notes.append("CUDA cannot use " + ", ".join(f"GPU{g.index} ({why[g.index]})" for g in unread) + ".")
    return VisibleDevices(None, uuids, indices, notes=tuple(notes), entries=(None,) * len(uuids),
                          how=(BY_ORDER,) * len(uuids))


def resolve(environ: Mapping[str, str], gpus: Sequence[Any]) -> VisibleDevices:
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return _resolve_unset(environ, gpus)
    tokens = [t.strip() for t in raw.split(",")]
    if raw.strip() == "":
        return VisibleDevices(raw, (), (), problems=("CUDA_VISIBLE_DEVICES is set to an empty string, "
                                                        "which hides every GPU from CUDA.",))
    visible: list[str] = []
    indices: list[int] = []
    entries: list[str | None] = []
    how: list[str] = []
    problems: list[str] = []
    notes: list[str] = []
    by_index = {g.index: g for g in gpus}
    for pos, token in enumerate(tokens):
        hit: tuple[str, int, str] | str | None
        if token.lstrip("-").isdigit():
            # Compared as text first: int() refuses more than 4,300 digits, and no GPU index is that long.
            number = int(token) if len(token) <= 9 else None
            g = by_index.get(number) if number is not None else None
            hit = (g.uuid, g.index, BY_INDEX) if g is not None and isinstance(g.uuid, str) else None
            plain = token if len(token) <= 20 else shown(token)
            if g is not None and hit is None:
                reason = f"index {token} is GPU{g.index}, whose UUID NVML could not read ({g.uuid})"
            else:
                reason = (f"index {plain} does not exist (this machine has {len(gpus)} GPU(s): "
                          f"0..{len(gpus) - 1})" if not token.startswith("-") else f"{plain} is not a device")
        elif token.startswith(("GPU-", "MIG-")):
            hit = _match_uuid(token, gpus)
            reason = hit if isinstance(hit, str) else f"no GPU or MIG device has UUID {shown(token)}"
        else:
            hit, reason = None, f"{shown(token)} is neither an index nor a GPU-/MIG- UUID"
        if not isinstance(hit, tuple):
            ignored = tokens[pos + 1:]
            listed = ", ".join(t if len(t) <= 20 else shown(t, 20) for t in ignored[:5])
            listed += f" and {len(ignored) - 5} more" if len(ignored) > 5 else ""
            tail = f"; the entries after it ({listed}) are ignored too" if ignored else ""
            problems.append(f"CUDA_VISIBLE_DEVICES entry {pos + 1}: {reason}. CUDA stops reading the list "
                            f"there{tail}.")
            break
        if hit[0] in visible:
            problems.append(f"CUDA_VISIBLE_DEVICES lists {shown(token)} twice.")
            break
        visible.append(hit[0])
        indices.append(hit[1])
        entries.append(token)
        how.append(hit[2])
    numeric = [t for t in tokens if t.isdigit()]
    if numeric and mixed_models(gpus) and not bus_order(environ):
        notes.append("GPUs of different models with numeric CUDA_VISIBLE_DEVICES: CUDA numbers them "
                     "fastest-first, NVML by bus id; set CUDA_DEVICE_ORDER=PCI_BUS_ID or use UUIDs.")
    return VisibleDevices(raw, tuple(visible), tuple(indices), tuple(problems), tuple(notes), tuple(entries),
                          tuple(how))
