"""The live monitor's data: the one sampler thread per kernel and its ring buffers (`sampler`), the
finding of unbalanced GPUs in its window (`imbalance`), and energy since the start and the traffic
on PCIe and NVLink with each link's limit (`traffic`).

Uses `readings`, and `energy` for its names of a figure's source and the user's tariff; drawing is
`views.sparkline` (charts), `views.links_view` (energy and link charts) and `views.monitor_layout`;
the thread's owner is `shells.monitor`."""
