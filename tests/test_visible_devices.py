"""CUDA_VISIBLE_DEVICES: indices, UUIDs (and prefixes), MIG forms, empty, invalid entries."""

from gpunb.readings.gpu import read_snapshot
from gpunb.readings.nvml import NvmlSession
from gpunb.readings.visible_devices import resolve
from gpunb.testing import scenario


def gpus(name):
    return read_snapshot(NvmlSession(scenario(name))).gpus


def test_unset_means_all_gpus():
    v = resolve({}, gpus("two-gpus"))
    assert v.raw is None and v.nvml_indices == (0, 1) and not v.problems


def test_integer_order_is_kept():
    v = resolve({"CUDA_VISIBLE_DEVICES": "1,0"}, gpus("two-gpus"))
    assert v.nvml_indices == (1, 0) and not v.problems


def test_uuid_prefix_selects_a_gpu():
    g = gpus("two-gpus")
    v = resolve({"CUDA_VISIBLE_DEVICES": g[1].uuid[:12]}, g)
    assert v.nvml_indices == (1,) and v.visible == (g[1].uuid,)


def test_empty_string_hides_every_gpu():
    v = resolve({"CUDA_VISIBLE_DEVICES": ""}, gpus("h200"))
    assert v.visible == () and "hides every GPU" in v.problems[0]


def test_invalid_entry_stops_the_list():
    v = resolve({"CUDA_VISIBLE_DEVICES": "0,7,1"}, gpus("two-gpus"))
    assert v.nvml_indices == (0,)
    assert "index 7 does not exist" in v.problems[0] and "(1) are ignored" in v.problems[0]


def test_minus_one_hides_everything():
    v = resolve({"CUDA_VISIBLE_DEVICES": "-1"}, gpus("h200"))
    assert v.visible == () and v.problems


def test_mig_uuid_selects_the_slice_on_its_parent():
    g = gpus("mig")
    mig = g[0].mig_devices[1].uuid
    v = resolve({"CUDA_VISIBLE_DEVICES": mig}, g)
    assert v.visible == (mig,) and v.nvml_indices == (0,) and not v.problems


def test_legacy_mig_form_is_understood():
    g = gpus("mig")
    token = f"MIG-{g[0].uuid}/1/0"
    v = resolve({"CUDA_VISIBLE_DEVICES": token}, g)
    assert v.nvml_indices == (0,) and not v.problems


def test_unknown_uuid_is_a_problem():
    v = resolve({"CUDA_VISIBLE_DEVICES": "GPU-deadbeef"}, gpus("h200"))
    assert v.visible == () and "no GPU or MIG device" in v.problems[0]


def test_ambiguous_prefix_is_reported():
    v = resolve({"CUDA_VISIBLE_DEVICES": "GPU-"}, gpus("two-gpus"))
    assert "matches 2 devices" in v.problems[0]


def test_mig_enabled_and_unset_gives_a_note():
    v = resolve({}, gpus("mig"))
    assert v.notes and "MIG" in v.notes[0]
