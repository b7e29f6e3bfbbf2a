"""A reward that gives half the prompts no signal (importable by Ray workers): dynamic sampling must refill."""

from __future__ import annotations

import zlib


def half_flat(prompts, completions, **_):
    """0 for every completion of a prompt whose CRC is even (a group without reward spread), else the
    completion's length in characters (a random tiny model's completions differ in length)."""
    return [0.0 if zlib.crc32(p.encode()) % 2 == 0 else float(len(c)) for p, c in zip(prompts, completions)]
