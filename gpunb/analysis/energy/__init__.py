"""What the GPUs spent: energy over a window from NVML's counter (``meter``: a cell, its steady
steps; ``since_load``: the kernel's GPUs since ``%load_ext``), what a cell moved over PCIe and NVLink
(``links``), and what that costs in money and CO₂
when the user names the price (``tariff``).

Uses `readings` only; the profile and the monitor use it."""
