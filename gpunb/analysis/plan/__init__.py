"""`%gpuplan` / `gpunb.plan()`: a training step's peak GPU memory, predicted without a GPU. The step runs
once on stand-in tensors (`stand_ins`), every allocation and free is recorded with its role and line
(`recorder`), replayed through a model of CUDA's caching allocator (`allocator`), and turned into the
answer for each GPU named (`planner`, `gpus`, `calibration`, `records`).

Uses `memory` (the trace record and its line folding, so the views are `%%gpumem --trace`'s) and `fit`
(what a step can reach). It never allocates GPU memory or creates a CUDA context."""
