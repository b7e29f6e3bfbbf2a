"""Search-R1 style retrieval: a BM25 search tool over the fictional-town corpus, and the environment offering it.

The questions (``data.task=facts``, ``relayrl.data.facts``) are about made-up towns, so a model can only
answer them by searching. The index is ``bm25s`` (Lucene BM25 over lower-cased word tokens, English stopwords
removed, no stemming), built from the corpus once per process and then shared by every episode; it runs
entirely in memory and downloads nothing.

An episode::

    system: instructions + the search tool     user: "In which year was Velmora founded?"
    assistant: search(query="Velmora founded")  -> tool: "[1] Velmora: Velmora is a town in ... founded in 1637. ..."
    assistant: "... Answer: 1637"                -> reward 1.0, done

``search_passages`` (the tool's text) and ``score_answer`` (the final turn's reward) are plain functions, so
they can be tested and reused without an episode.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import threading
import unicodedata
from collections.abc import Sequence
from typing import Any

from relayrl.data.facts import N_DOCS, corpus
from relayrl.envs.toolenv import ToolEnv
from relayrl.envs.tools import ToolError

MAX_QUERY_CHARS = 300
"""Longer queries are refused: a query is a few words, and tokenizing pages of text only wastes the tool call."""
MAX_K = 3
"""At most this many passages per search: three passages (at most ~250 characters each, plus titles) stay under
``ToolEnv``'s default cut of 1000 characters per result."""
ANSWER_TAG = "Answer:"
"""The final answer is the rest of the line after the last occurrence of this tag (as ``arith_correct``)."""

INSTRUCTIONS = (
    "Answer the question about a fictional town. The answer is not common knowledge: look it up with the search "
    "tool, which returns the {k} encyclopedia passages that best match your query (search for the town's name). "
    "When you know the answer, reply without calling the tool and end with a line 'Answer: <answer>', giving "
    "only the answer as the passage writes it (a year, a number, or a name)."
)
"""The system-prompt text of ``RetrievalEnv`` (``{k}``: passages per search)."""


def import_bm25s() -> Any:
    """``bm25s``, imported without numba. bm25s imports numba at import time whenever it is installed (vLLM
    installs it), and numba's llvmlite objects then sit in ``sys.modules``, where vLLM's kernel-override scan at
    engine start trips on them (``AttributeError: '_lib_fn_wrapper' object has no attribute 'get'``): a rollout
    actor or test process that imported the retrieval env could not start an engine after. We use bm25s's
    numpy backend anyway, so numba is hidden while bm25s imports (``from numba import ...`` then raises
    ``ImportError``, which bm25s handles)."""
    if "bm25s" in sys.modules:
        return sys.modules["bm25s"]
    hide = "numba" not in sys.modules
    if hide:
        sys.modules["numba"] = None  # type: ignore[assignment]
    try:
        import bm25s
    finally:
        if hide:
            del sys.modules["numba"]
    return bm25s


class Bm25Index:
    """BM25 (``bm25s``, Lucene scoring) over a fixed list of documents; ``search`` is safe from many threads
    (it only reads the index)."""

    def __init__(self, docs: Sequence[str]) -> None:
        bm25s = import_bm25s()
        if not docs:
            raise ValueError("Bm25Index needs at least one document")
        self.docs = list(docs)
        self._bm25 = bm25s.BM25(backend="numpy")  # numba's JIT would compile for seconds at first use
        self._bm25.index(self._tokens(self.docs), show_progress=False)

    @staticmethod
    def _tokens(texts: list[str]) -> list[list[str]]:
        return import_bm25s().tokenize(texts, stopwords="en", return_ids=False, show_progress=False)

    def search(self, query: str, k: int) -> list[tuple[int, str, float]]:
        """The (up to) ``k`` best documents for ``query``, best first: ``(doc_id, text, score)``. Documents
        sharing no word with the query are never returned, so an empty or stopword-only query finds nothing.
        Ties keep corpus order, so the result is deterministic."""
        import numpy as np

        ids = self._bm25.get_tokens_ids(self._tokens([query])[0])
        if not ids or k < 1:
            return []
        scores = self._bm25.get_scores_from_ids(ids)
        best = np.argsort(-scores, kind="stable")[:k]
        return [(int(i), self.docs[i], float(scores[i])) for i in best if scores[i] > 0]


_INDEX_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4)
def _build_index(n_docs: int) -> Bm25Index:
    return Bm25Index([town.text for town in corpus(n_docs)])


def facts_index(n_docs: int = N_DOCS) -> Bm25Index:
    """The index of the ``n_docs``-town corpus, built once per process (episodes run in worker threads: the
    lock keeps two of them from building it twice)."""
    with _INDEX_LOCK:
        return _build_index(n_docs)


def search_passages(query: str, k: int = 2, n_docs: int = N_DOCS) -> str:
    """The tool's reply to ``query``: the ``k`` best passages, numbered and titled with their town, one per
    line; a line saying nothing matched when no passage shares a word with the query. ``ToolError`` for a
    query that is not a search (not text, empty, or over ``MAX_QUERY_CHARS``)."""
    if not isinstance(query, str):
        raise ToolError(f"query must be text, got {type(query).__name__}")
    query = query.strip()
    if not query:
        raise ToolError("empty query; search for a few words, e.g. a town's name")
    if len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"query has {len(query)} characters; at most {MAX_QUERY_CHARS}: search for a few words")
    towns = corpus(n_docs)
    hits = facts_index(n_docs).search(query, k)
    if not hits:
        return "No passage matches the query; search for a town's name."
    return "\n".join(f"[{rank}] {towns[i].name}: {text}" for rank, (i, text, _) in enumerate(hits, 1))


_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalization: case-folded, punctuation and symbols dropped, articles (a, an, the)
    dropped, whitespace collapsed. ``"The Dranel."`` and ``"dranel"`` compare equal, as do ``"12,480"`` and
    ``"12480"``."""
    text = unicodedata.normalize("NFKC", text).casefold().replace(",", "")  # thousands separators
    text = "".join(" " if unicodedata.category(c)[0] in "PS" else c for c in text)  # P*: punctuation, S*: symbols
    return " ".join(_ARTICLES.sub(" ", text).split())


def extract_answer(text: str) -> str | None:
    """The rest of the line after the last ``Answer:`` in ``text``, stripped; None when there is none."""
    tag = text.rfind(ANSWER_TAG)
    if tag < 0:
        return None
    return text[tag + len(ANSWER_TAG) :].split("\n", 1)[0].strip()


def score_answer(text: str, answer: str) -> float:
    """1.0 when the final answer in ``text`` (``extract_answer``) equals ``answer`` after ``normalize_answer``,
    else 0.0. Exact match, not containment: an answer line listing several candidates earns nothing."""
    given, expected = extract_answer(text), normalize_answer(str(answer))
    return float(given is not None and bool(expected) and normalize_answer(given) == expected)


class RetrievalEnv(ToolEnv):
    """Questions about fictional towns (``data.task=facts``) with a ``search`` tool over their encyclopedia.

    A turn with a search call gets the ``k`` best passages back (reward 0, the episode goes on); a turn with no
    call is the final answer: reward 1.0 if the rest of the line after its last ``Answer:`` equals the row's
    ``answer`` (``score_answer``: case, punctuation, articles and whitespace aside), else 0.0; done.
    ``n_docs``: the corpus size, which must match the one the questions were drawn from (the default).
    Other keyword arguments go to ``ToolEnv`` (``tool_timeout_s``, ``max_result_chars``).
    """

    def __init__(self, k: int = 2, n_docs: int = N_DOCS, **kw: Any) -> None:
        super().__init__(**kw)
        if not 1 <= k <= MAX_K:
            raise ValueError(f"RetrievalEnv: k={k} passages per search must be in [1, {MAX_K}]; fix env.kwargs.k")
        self.k, self.n_docs = k, n_docs
        facts_index(n_docs)  # built now, at construction (the config check makes one), not in the first episode
        self.tools = [self.search]

    def reset(self, sample: dict[str, Any]) -> str:
        if "answer" not in sample:
            raise ValueError(
                f"RetrievalEnv needs an 'answer' column, the sample has {sorted(sample)}; use data.task=facts"
            )
        return super().reset(sample)

    def search(self, query: str) -> str:
        """Search the encyclopedia of towns for the passages that best match a query.

        Args:
            query: a few words to look for, e.g. a town's name
        """
        return search_passages(query, self.k, self.n_docs)

    def instructions(self, sample: dict[str, Any]) -> str:
        return INSTRUCTIONS.format(k=self.k)

    def finish(self, action: str) -> tuple[str, float, bool]:
        return "", score_answer(action, self.sample["answer"]), True

    def demonstration(self, sample: dict[str, Any]) -> list[str]:
        """The model turns of a worked episode (a supervised warm start replays them through this env): one
        search for the town's name (the row's ``entity``), then the answer."""
        if "entity" not in sample:
            raise ValueError(
                f"RetrievalEnv.demonstration needs the 'entity' column of data.task=facts, the sample has "
                f"{sorted(sample)}"
            )
        call = json.dumps({"name": "search", "arguments": {"query": str(sample["entity"])}})
        return [f"<tool_call>\n{call}\n</tool_call>", f"Answer: {sample['answer']}"]
