"""What ``relayrl plan`` prints: the profile's terms, the ranked layouts as a rich table, the recommended
overrides; and the profile's loading from run dirs, a yaml of given figures and ``--set`` overrides."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from relayrl.plan.model import Prediction, colocated_slowdown
from relayrl.plan.profile import Profile


def load_profile(runs: list[str], profile_file: str | None, sets: list[str], cores: int | None) -> Profile:
    """From run dirs (measured) or a yaml/json file of field values (given), then ``field=value`` overrides."""
    import yaml

    if bool(runs) == bool(profile_file):
        raise ValueError("give run directories (relayrl plan runs/<id> ...) or --profile FILE, not both or neither")
    if profile_file:
        data = yaml.safe_load(Path(profile_file).read_text()) or {}
        profile = Profile.from_dict(data, source=profile_file)
    else:
        given = _parse_sets(sets)  # efficiencies given with --set also turn the runs into device costs
        assumed = {k: given[k] for k in ("train_efficiency", "gen_efficiency") if k in given}
        profile = Profile.from_runs(runs, cores, **assumed)
    return dataclasses.replace(profile, **_parse_sets(sets)) if sets else profile


def _parse_sets(sets: list[str]) -> dict[str, Any]:
    names = {f.name: f.type for f in dataclasses.fields(Profile)}
    out = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or key not in names or key == "source":
            raise ValueError(
                f"--set {item!r}: use field=value with a profile field: {', '.join(n for n in names if n != 'source')}"
            )
        out[key] = (
            int(value)
            if key == "prompts_per_step"
            else value.lower() in ("1", "true", "yes")
            if key == "cpu"
            else float(value)
        )
    return out


def save_profile(profile: Profile, path: str) -> None:
    import yaml

    Path(path).write_text(yaml.safe_dump(profile.to_dict(), sort_keys=False))


def profile_lines(profile: Profile) -> list[str]:
    """The measured terms in one glance (seconds per step unless said)."""
    p = profile
    return [
        f"profile: {p.source}",
        f"  per step: {p.tokens:.0f} tokens, {p.completions:.0f} completions, {p.prompts_per_step} prompts",
        f"  generate {p.gen_dev_s_per_token * 1e3:.3f} device-ms/token + {p.gen_call_s:.3f} s/call | "
        f"train {p.train_dev_s_per_token * 1e3:.3f} device-ms/token + {p.train_fixed_s:.3f} s "
        f"(e={p.train_efficiency:.3g} beyond 1 device) | reward {p.reward_s:.3f} s"
        + (f" | g={p.gen_efficiency:.3g} for a replica on more threads" if p.cpu else "")
        + (
            f" | t > 1 ranks: e={p.rank_efficiency:.3g}, + {p.rank_collective_s:.3f} s/step, "
            f"+ {p.sync_gather_s:.3f} s/sync"
            if p.rank_efficiency is not None
            else ""
        ),
        f"  sync {p.sync_bytes / 1e6:.1f} MB at {p.sync_bytes_per_s / 1e9:.3f} GB/s + {p.sync_fixed_s:.3f} s "
        f"(stall {p.stall_s:.3f} s) | overhead {p.overhead_s:.3f} s/step | switch {p.switch_s:.3f} s | "
        f"overlap slowdown "
        + (
            "(2r+t)/(r+t), CPU cores"
            if p.overlap_slowdown is None and p.cpu
            else f"{1.0 if p.overlap_slowdown is None else p.overlap_slowdown:g}"
        )
        + f" | colocated generation slowdown {colocated_slowdown(p):g}",
        "  engine occupancy "
        + ("not logged: no streaming layouts" if p.gen_occupancy is None else f"{p.gen_occupancy:.2f}"),
    ]


def plan_table(preds: list[Prediction]) -> Any:
    """A rich Table in the simulator's order (``calibrate.rank``): its step, throughput and idle fractions, the
    closed-form laws' step beside (``laws s``) and their bottleneck; a caption says what shared means when it is
    listed."""
    from rich.table import Table

    shared = any(p.layout.placement == "shared" for p in preds)
    caption = (
        "shared N:N = relayrl's CPU default: placement=separate mode=sync, the replica and the rank "
        "each on all N cores, taking turns"
        if shared
        else None
    )
    table = Table(
        "#",
        "placement",
        "rollout:trainer",
        "mode",
        "step s",
        "laws s",
        "completions/s",
        "tokens/s",
        "bottleneck",
        "idle rollout",
        "idle trainer",
        caption=caption,
    )
    for i, p in enumerate(preds, 1):
        lay = p.layout
        table.add_row(
            str(i),
            lay.placement,
            lay.split(),
            lay.schedule,
            f"{p.step_s:.3f}",
            "" if p.laws_step_s is None else f"{p.laws_step_s:.3f}",
            f"{p.completions_per_s:.2f}",
            f"{p.tokens_per_s:.1f}",
            p.bottleneck,
            f"{p.idle_rollout:.2f}",
            f"{p.idle_trainer:.2f}",
            style="bold green" if i == 1 else None,
        )
    return table
