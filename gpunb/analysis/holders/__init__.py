"""Who holds each GPU: NVML processes joined with a Jupyter server's kernels and notebooks (`gpus`), each
kernel's share of its GPUs' energy (`kernel_energy`), and the kernel's own view of that for the monitor
and the OOM doctor (`server`).

Uses `readings` only."""
