"""Say a value once when every GPU has it: "all 8 GPUs: 35–37 °C" instead of eight sentences.

The checks write their findings per GPU (``GPU0: 35 °C (slowdown at 89 °C); GPU1: …``), which
is what the data and the details keep. The default view folds them: identical values are said
once, values that differ only in their numbers become a range, and GPUs that differ are named
in groups (``GPU0–6: on; GPU7: off``). Parenthesised qualifiers stay in the details.
"""

from __future__ import annotations

import re

# "GPU3: …" or "GPU0↔GPU1: …" at the start of a part; parts are separated by "; ".
_KEY = re.compile(r"(?:^|; )(GPU\d+(?:↔GPU\d+)?): ")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def split_per_gpu(text: str) -> list[tuple[str, str]] | None:
    """[(key, value)] when ``text`` is entirely "GPUn: value; GPUm: value…", else None."""
    keys = list(_KEY.finditer(text))
    if not keys or keys[0].start() != 0:
        return None
    parts = []
    for key, following in zip(keys, [*keys[1:], None], strict=True):
        end = following.start() if following is not None else len(text)
        parts.append((key.group(1), text[key.end():end]))
    return parts


def without_qualifiers(text: str) -> str:
    """``text`` without its " (…)" asides, nested ones included ("process(es)" stays)."""
    previous = None
    while previous != text:
        previous = text
        text = re.sub(r" \([^()]*\)", "", text)
    return text.strip()


def _as_range(values: list[str]) -> str | None:
    """One phrase for values that differ only in their numbers: "35–37 °C"; None otherwise."""
    templates = {_NUMBER.sub("#", v) for v in values}
    if len(templates) != 1:
        return None
    columns = list(zip(*(_NUMBER.findall(v) for v in values), strict=True))
    words = iter(re.split(r"#", templates.pop()))
    out = next(words)
    for column, after in zip(columns, words, strict=True):
        numbers = sorted({float(n) for n in column})
        low, high = (min(column, key=float), max(column, key=float))
        out += low if len(numbers) == 1 else f"{low}–{high}"
        out += after
    return out


def _span(keys: list[str]) -> str:
    """"GPU0–3, GPU6" from consecutive single-GPU keys; pair keys are joined with commas."""
    indices = [int(k[3:]) for k in keys if re.fullmatch(r"GPU\d+", k)]
    if len(indices) != len(keys):
        return ", ".join(keys)
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(f"GPU{r[0]}–{r[-1]}" if len(r) > 2 else ", ".join(f"GPU{i}" for i in r) for r in runs)


def fold(text: str, noun: str = "GPUs") -> str:
    """``text`` said once per distinct value, without qualifiers (see the module doc)."""
    parts = split_per_gpu(text)
    if parts is None:
        return without_qualifiers(text)
    values = [without_qualifiers(v) for _, v in parts]
    if len(parts) == 1:
        return f"{parts[0][0]}: {values[0]}"
    same = values[0] if len(set(values)) == 1 else _as_range(values)
    if same is not None:
        return f"{'both' if len(parts) == 2 else f'all {len(parts)}'} {noun}: {same}"
    groups: dict[str, list[str]] = {}
    for (key, _), value in zip(parts, values, strict=True):
        groups.setdefault(value, []).append(key)
    return "; ".join(f"{_span(keys)}: {value}" for value, keys in groups.items())


def gpu_span(indices: list[int]) -> str:
    """"GPU0–3, GPU6" for GPU indices (consecutive ones joined)."""
    return _span([f"GPU{i}" for i in indices])
