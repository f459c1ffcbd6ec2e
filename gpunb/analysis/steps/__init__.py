"""Inside one training process: the hooks a profiled cell installs (`instruments`), CUDA-event step
times (`events`), the few steps looked at closely (`plan`: FLOP counting, the op trace), tokens per
sample read from a batch (`tokens`) and their records.

Used by `profile` in the kernel and by `ranks` in worker processes; it imports no other capability."""
