"""Whose memory: the tensor census that names holders (`census`), `%gpumem` (`report`), the OOM doctor
(`oom`, `oom_message`, `oom_records`) and giving back what a failed cell pins (`release`).

Uses `holders` (who else holds a GPU) and the shared `advice`; never `fit` (the last fit is passed in)."""
