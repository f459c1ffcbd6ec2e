"""Where the GPU tests write what they measured: ``$GPUNB_RESULTS`` (scripts/gpu-box-run.sh
sets it), else one temporary directory for the pytest process."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

RESULTS = Path(os.environ.get("GPUNB_RESULTS") or tempfile.mkdtemp(prefix="gpunb-results-"))


def save_json(filename: str, data: Any) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / filename).write_text(json.dumps(data, indent=2, default=str))
