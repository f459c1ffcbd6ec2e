"""The server's energy metrics against a real Jupyter server and a real kernel holding the (fake,
recorded H200) GPU: the GPU's counter, and the kernel's share between two scrapes."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpunb.testing.fake_nvml import load_energy_links

from .conftest import GiB, hold, kernel_holding_devices, start_session


class Clock:
    t = 2.0

    def __call__(self) -> float:
        return self.t


async def scrape(jp_fetch) -> dict:
    r = await jp_fetch("gpunb", "metrics")
    return {f.name: f for f in text_string_to_metric_families(r.body.decode())}


async def test_a_kernel_holding_the_gpu_gets_its_energy_between_two_scrapes(jp_fetch, jp_serverapp, fake_gpu):
    clock = Clock()
    fake_gpu.clock = clock
    fake_gpu.gpus[0].energy = load_energy_links()["samples"]
    lesson = await start_session(jp_fetch, "lesson3.ipynb")
    hold(fake_gpu, await kernel_holding_devices(jp_serverapp, lesson["kernel"]["id"]), 4 * GiB)

    first = await scrape(jp_fetch)
    start_j = fake_gpu.gpus[0].energy_at(2.0)[0] / 1000.0
    (gpu,) = first["gpunb_gpu_energy_joules"].samples
    assert gpu.name == "gpunb_gpu_energy_joules_total" and gpu.value == pytest.approx(start_j)
    assert first["gpunb_kernel_gpu_energy_joules"].samples == []  # one reading: no interval yet

    clock.t = 12.0
    await asyncio.sleep(1.1)  # past the 1 s the server reuses a report for
    second = await scrape(jp_fetch)
    end_j = fake_gpu.gpus[0].energy_at(12.0)[0] / 1000.0
    assert end_j - start_j > 100
    (share,) = second["gpunb_kernel_gpu_energy_joules"].samples
    assert share.labels["path"] == "lesson3.ipynb" and share.labels["kernel_id"] == lesson["kernel"]["id"]
    assert share.value == pytest.approx(end_j - start_j)  # the only holder: all of it
    (idle,) = second["gpunb_kernel_gpu_idle_energy_joules"].samples
    assert idle.value == pytest.approx(end_j - start_j)  # idle at both scrapes
