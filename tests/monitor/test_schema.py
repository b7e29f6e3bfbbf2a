from pathlib import Path

from relayrl.monitor.schema import GROUPS, SCHEMA, canonical_name, expected, lookup, to_schema
from relayrl.monitor.schema_doc import schema_markdown

DOCS = Path(__file__).resolve().parents[2] / "docs" / "observability.md"


def test_groups_are_the_issue_sections_in_order():
    assert GROUPS == (
        "reward",
        "policy",
        "dapo",
        "trainer",
        "rollout",
        "env",
        "staleness",
        "buffer",
        "accounting",
        "timing",
        "startup",
        "idle",
        "memory",
        "colocated",
        "weightsync",
        "mismatch",
        "perf",
        "eval",
    )
    names = [m.name for m in SCHEMA]
    assert len(names) == len(set(names))
    for name in (
        "policy/kl",
        "policy/entropy",
        "policy/clip_frac",
        "policy/grad_norm",
        "policy/lr",
        "perf/completions_per_s",
        "perf/tokens_per_s",
        "timing/generate",
        "timing/reward",
        "timing/logprob",
        "timing/train",
        "timing/sync",
        "timing/wait",
        "idle/rollout",
        "idle/trainer",
        "weightsync/bytes",
        "weightsync/gbps",
        "rollout/tokens_per_s",
        "rollout/truncated_frac",
        "trainer/token_imbalance",
        "memory/trainer_peak_gb",
        "memory/engine_gb",
    ):
        assert name in names, name


def test_trainer_and_scheduler_names_become_schema_names():
    assert [
        canonical_name(k)
        for k in (
            "loss",
            "kl",
            "grad_norm",
            "clip_frac",
            "timing/score",
            "logprob_seconds",
            "train_seconds",
            "reward/mean",
            "trainer/token_imbalance",  # the trainer's own schema names pass through
            "memory/trainer_peak_gb",
        )
    ] == [
        "policy/loss",
        "policy/kl",
        "policy/grad_norm",
        "policy/clip_frac",
        "timing/reward",
        "timing/logprob",
        "timing/update",
        "reward/mean",
        "trainer/token_imbalance",
        "memory/trainer_peak_gb",
    ]


def test_to_schema_derives_lr_and_throughput_by_hand():
    producer = {
        "loss": 0.5,
        "rollout/tokens": 120.0,
        "rollout/completions": 8.0,
        "timing/step": 4.0,
        "timing/generate": 1.5,
        "timing/score": 0.25,
    }
    out = to_schema(producer, lr=1e-3, replicas=2)
    assert out["policy/loss"] == 0.5 and out["timing/reward"] == 0.25 and "loss" not in out
    assert out["policy/lr"] == 1e-3
    assert out["perf/tokens_per_s"] == 30.0  # 120 tokens / 4 s
    assert out["perf/tokens_per_s_per_replica"] == 15.0  # / 2 replicas
    assert out["perf/completions_per_s"] == 2.0  # 8 / 4 s
    assert out["rollout/tokens_per_s"] == 40.0  # 120 / (2 calls x 1.5 s)
    assert to_schema({"lr": 5e-4}, lr=1e-3, replicas=1)["policy/lr"] == 5e-4  # a schedule's own value wins
    refilled = to_schema({**producer, "rollout/calls": 3.0}, lr=1e-3, replicas=2)  # DAPO drew a third call
    assert refilled["rollout/tokens_per_s"] == 120 / (3 * 1.5)
    assert all(lookup(k) is not None for k in out), [k for k in out if lookup(k) is None]


def _name(key: str) -> str:
    metric = lookup(key)
    assert metric is not None, key
    return metric.name


def test_lookup_prefers_exact_names_and_families_match_one_part():
    assert _name("reward/mean") == "reward/mean"
    assert _name("reward/digit_fraction") == "reward/<fn>"
    assert _name("reward/errors/timeout") == "reward/errors/<reason>"
    assert _name("staleness/2") == "staleness/<d>" and _name("staleness/max") == "staleness/max"
    assert lookup("staleness/abc") is None and lookup("loss") is None and lookup("nope/x") is None


def test_expected_by_condition():
    always = {m.name for m in expected(set())}
    assert "reward/mean" in always and "mismatch/mean_abs" not in always
    assert "mismatch/mean_abs" in {m.name for m in expected({"verify"})}
    assert "buffer/dropped/<reason>" not in always and "policy/value_loss" not in always


def test_docs_page_shows_the_schema_verbatim():
    text = DOCS.read_text()
    table = text.split("<!-- schema:start -->\n", 1)[1].split("<!-- schema:end -->", 1)[0]
    assert table == schema_markdown(), "docs/observability.md is stale: python -m relayrl.monitor.schema_doc"
