"""The live monitor's data: the one sampler thread per kernel and its ring buffers (`sampler`), and the
finding of unbalanced GPUs in its window (`imbalance`).

Uses `readings` only; drawing is `views.sparkline` (charts) and `views.monitor_layout`;
the thread's owner is `shells.monitor`."""
