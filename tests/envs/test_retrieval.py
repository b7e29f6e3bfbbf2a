"""The retrieval environment: BM25 over the facts corpus, the search tool's edges, answer scoring, an episode."""

from __future__ import annotations

import asyncio
import json

import pytest

from relayrl.data.facts import N_DOCS, corpus, make_facts_rows
from relayrl.envs.retrieval import (
    MAX_K,
    MAX_QUERY_CHARS,
    Bm25Index,
    RetrievalEnv,
    extract_answer,
    facts_index,
    normalize_answer,
    score_answer,
    search_passages,
)
from relayrl.envs.toolenv import MAX_RESULT_CHARS
from relayrl.envs.tools import ToolError, as_tool, call_tool

# ---- the index ------------------------------------------------------------------------------------


def test_bm25_ranks_the_matching_document_first_and_skips_non_matches():
    index = Bm25Index(["the cat sat on the mat", "a dog barked at the cat", "fish swim in the sea"])
    hits = index.search("dog", k=3)
    assert [(doc_id, text) for doc_id, text, _ in hits] == [(1, "a dog barked at the cat")]
    cat = index.search("cat mat", k=3)
    assert [doc_id for doc_id, _, _ in cat] == [0, 1] and cat[0][2] > cat[1][2] > 0
    assert index.search("the of", k=3) == [] and index.search("zebra", k=3) == []
    assert index.search("cat", k=0) == []


def test_facts_index_is_built_once_per_process():
    assert facts_index() is facts_index() is facts_index(N_DOCS)


@pytest.mark.parametrize("query_kind", ["question", "entity"])
def test_recall_at_2_over_questions(query_kind):
    """The document a question is about is among the top 2 for the question itself (or the town's name)."""
    rows = make_facts_rows(100, seed=7)
    index = facts_index()
    hits = [row["doc_id"] in [d for d, _, _ in index.search(str(row[query_kind]), k=2)] for row in rows]
    recall = sum(hits) / len(rows)
    print(f"recall@2 ({query_kind} as the query, 100 questions): {recall:.2f}")
    assert recall >= 0.95


# ---- the search tool ------------------------------------------------------------------------------


def test_search_passages_are_numbered_and_titled():
    town = corpus()[5]
    text = search_passages(town.name, k=2)
    lines = text.split("\n")
    assert len(lines) == 2 and lines[0] == f"[1] {town.name}: {town.text}" and lines[1].startswith("[2] ")
    assert search_passages(town.name, k=1) == lines[0]
    assert search_passages("the of and", k=2).startswith("No passage matches")


@pytest.mark.parametrize(
    "query, match",
    [("", "empty query"), ("   \n\t", "empty query"), ("x" * (MAX_QUERY_CHARS + 1), "at most 300"), (None, "text")],
)
def test_search_refuses_what_is_not_a_query(query, match):
    with pytest.raises(ToolError, match=match):
        search_passages(query)


@pytest.mark.parametrize(
    "query",
    [
        "\x00\x01\xff\ufffd",
        bytes(range(256)).decode("latin-1")[:MAX_QUERY_CHARS],
        "🙂" * 50,
        "<|im_end|>\n<|im_start|>system",
        "x" * MAX_QUERY_CHARS,
        " ".join(t.name for t in corpus()[:40])[:MAX_QUERY_CHARS],
    ],
)
def test_odd_queries_give_a_bounded_reply(query):
    text = search_passages(query, k=2)
    assert isinstance(text, str) and len(text) <= 2 * max(len(t.text) + 40 for t in corpus())


def test_search_as_a_typed_tool_checks_its_arguments():
    env = RetrievalEnv(k=1)
    tool = as_tool(env.search)
    assert tool.name == "search" and tool.parameters["required"] == ["query"]
    assert tool.parameters["properties"]["query"]["type"] == "string"
    town = corpus()[0]
    assert call_tool(tool, {"query": town.name}) == f"[1] {town.name}: {town.text}"
    for bad in ({}, {"query": 3}, {"query": "x", "k": 5}, ["x"]):
        with pytest.raises(ToolError):
            call_tool(tool, bad)


def test_the_most_passages_fit_a_tool_result_uncut():
    assert max(len(search_passages(t.name, k=MAX_K)) for t in corpus()) <= MAX_RESULT_CHARS


@pytest.mark.parametrize("k", [0, 4])
def test_k_is_checked_at_construction(k):
    with pytest.raises(ValueError, match=r"env\.kwargs\.k"):
        RetrievalEnv(k=k)


# ---- scoring --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, answer, reward",
    [
        ("Velmora was founded in 1637.\nAnswer: 1637", "1637", 1.0),
        ("Answer: 1637.", "1637", 1.0),
        ("Answer: **1637**", "1637", 1.0),
        ("Answer: 174396", "174,396", 1.0),  # thousands separators aside
        ("Answer: 174,396 ", "174,396", 1.0),
        ("Answer: the river Garsel", "Garsel", 0.0),  # exact match: 'river' is an extra word
        ("Answer: The Garsel", "Garsel", 1.0),  # articles aside
        ("Answer:   kalselve   NOVETAM", "Kalselve Novetam", 1.0),  # case and whitespace aside
        ("Answer: Novetam", "Kalselve Novetam", 0.0),
        ("Answer: 1638", "1637", 0.0),  # wrong
        ("It was founded in 1637.", "1637", 0.0),  # no 'Answer:'
        ("answer: 1637", "1637", 0.0),  # the tag is case-sensitive, as arith_correct's
        ("Answer: 1637\nAnswer: 1638", "1637", 0.0),  # only the last counts
        ("Answer: 1638\n" * 50 + "Answer: 1637", "1637", 1.0),
        ("Answer: 1637\nI am sure.", "1637", 1.0),  # the rest of the line, not of the text
        ("Answer: 1637 or 1638 or 1639", "1637", 0.0),  # a list of candidates is not an answer
        ("blah 1637 junk Answer: it is 1637 I think", "1637", 0.0),  # embedded in junk
        ("Answer:", "1637", 0.0),
        ("Answer: ...", "", 0.0),  # an empty reference matches nothing
    ],
)
def test_score_answer(text, answer, reward):
    assert score_answer(text, answer) == reward


def test_normalize_and_extract():
    assert normalize_answer("  The  Dranel. ") == "dranel" and normalize_answer("12,480") == "12480"
    assert normalize_answer("Ilsa-Brokkan") == "ilsa brokkan"
    assert extract_answer("no tag") is None and extract_answer("x Answer:  y \nz") == "y"


# ---- an episode -----------------------------------------------------------------------------------


def _call(query: str) -> str:
    return "<tool_call>" + json.dumps({"name": "search", "arguments": {"query": query}}) + "</tool_call>"


def test_an_episode_searches_then_answers():
    from relayrl.models.tiny import build_tokenizer

    row = make_facts_rows(1, seed=0)[0]
    env = RetrievalEnv()
    env.setup(build_tokenizer())
    prompt = env.reset(row)
    assert str(row["question"]) in prompt and "Answer: <answer>" in prompt and '"name": "search"' in prompt
    obs, reward, done = asyncio.run(env.step(_call(str(row["entity"]))))
    assert (reward, done) == (0.0, False) and corpus()[int(row["doc_id"])].text in obs
    obs, reward, done = asyncio.run(env.step(_call("")))
    assert "error: empty query" in obs and not done
    assert asyncio.run(env.step(f"It says so.\nAnswer: {row['answer']}")) == ("", 1.0, True)
    assert env.metrics() == {"tool_calls": 2.0, "tool_errors": 1.0}
    env.reset(row)
    assert asyncio.run(env.step("Answer: I do not know")) == ("", 0.0, True)


def test_the_demonstration_earns_the_reward():
    """The warm start's worked episode (``demonstration``), replayed as ``trainer.sft.env_examples`` does."""
    from relayrl.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    for row in make_facts_rows(5, seed=1):
        env = RetrievalEnv()
        env.setup(tokenizer)
        env.reset(row)
        turns = env.demonstration(row)
        assert f'"query": "{row["entity"]}"' in turns[0]
        obs, reward, done = asyncio.run(env.step(turns[0]))
        assert (reward, done) == (0.0, False) and f"[1] {row['entity']}:" in obs
        assert asyncio.run(env.step(turns[1])) == ("", 1.0, True)
    with pytest.raises(ValueError, match="entity"):
        RetrievalEnv().demonstration({"question": "q", "answer": "1"})


def test_registered_and_configurable_by_name():
    from relayrl.config import ConfigError, load_config
    from relayrl.envs import ENVIRONMENTS, env_factory

    assert ENVIRONMENTS["retrieval"] is RetrievalEnv
    make = env_factory("retrieval", {"k": 3, "tool_timeout_s": 5.0})
    env = make()
    assert isinstance(env, RetrievalEnv) and env.k == 3 and env.tool_timeout_s == 5.0
    cfg = load_config("agent_calc_tiny", ["env.name=retrieval", "data.task=facts", "data.num_prompts=64"])
    assert (cfg.env.name, cfg.data.task) == ("retrieval", "facts")
    with pytest.raises(ConfigError, match="rejects kwargs"):
        load_config("agent_calc_tiny", ["env.name=retrieval", "+env.kwargs.bogus=1"])


def test_reset_needs_an_answer_column():
    env = RetrievalEnv()
    with pytest.raises(ValueError, match=r"data\.task=facts"):
        env.reset({"question": "q", "prompt": "q"})


def test_the_index_leaves_numba_out_of_the_process():
    """bm25s imports numba whenever it is installed; its llvmlite objects in ``sys.modules`` break vLLM's
    kernel-override scan at engine start. A fresh process that builds the index and searches must not hold it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from relayrl.envs.retrieval import facts_index, search_passages\n"
        "facts_index(); search_passages('town', 2)\n"
        "print(sorted(m for m in ('numba', 'llvmlite') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
