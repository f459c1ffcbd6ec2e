"""`%gpufit` / `gpunb.fit_batch_size()`: the search for the largest batch that trains (`search`), one
sustained trial (`trial`), a fresh start for each trial (`fresh_state`) and the records.

Uses `memory` (to recognise an OOM) and `readings`; nothing else."""
