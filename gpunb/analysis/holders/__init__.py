"""Who holds each GPU: NVML processes joined with a Jupyter server's kernels and notebooks (`gpus`), and
the kernel's own view of that for the monitor and the OOM doctor (`server`).

Uses `readings` only."""
