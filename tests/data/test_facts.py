"""The fictional-town corpus (``data.task=facts``): fixed, unique names, and questions its documents answer."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from relayrl.config import ConfigError, DataConfig
from relayrl.data import load_heldout, load_task
from relayrl.data.facts import N_DOCS, QUESTIONS, SEED, Town, corpus, make_facts_rows


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def test_corpus_is_fixed_and_cached():
    towns = corpus()
    assert len(towns) == N_DOCS and [t.doc_id for t in towns] == list(range(N_DOCS))
    assert corpus() is towns  # cached: built once per process
    corpus.cache_clear()
    rebuilt = corpus()
    assert rebuilt is not towns and rebuilt == towns  # the same documents from the module seed alone
    assert SEED.startswith("relayrl-facts/")


def test_names_are_unique_made_up_words():
    towns = corpus()
    names = [t.name for t in towns]
    surnames = [t.mayor.split()[1] for t in towns]
    pools = {t.river for t in towns} | {t.region for t in towns} | {t.mayor.split()[0] for t in towns}
    assert len(set(names)) == len(names) and len(set(surnames)) == len(surnames)
    assert not (set(names) & set(surnames)) and not (set(names) | set(surnames)) & pools
    # no name is a word of the documents' own wording, so a town's name finds only documents about it
    wording = set()
    for t in towns:
        text = t.text
        for name in (t.name, *t.mayor.split(), t.river, t.region, t.neighbour):
            text = re.sub(rf"\b{name}\b", " ", text)
        wording |= set(_words(text))
    assert "founded" in wording and not {n.lower() for n in names + surnames} & wording


def test_each_document_states_its_facts_and_names_its_town_only_with_its_neighbours():
    towns = corpus()
    mentions = Counter(w for t in towns for w in set(_words(t.text)))
    neighbours_of = Counter(t.neighbour for t in towns)
    for t in towns:
        for attribute in QUESTIONS:
            assert t.answer(attribute) in t.text
        assert t.text.count(t.name) >= 2 and t.neighbour != t.name
        assert mentions[t.name.lower()] == 1 + neighbours_of[t.name]


def test_question_rows_are_seeded_and_answered_by_their_document():
    rows = make_facts_rows(500, seed=3)
    assert rows == make_facts_rows(500, seed=3) and rows != make_facts_rows(500, seed=4)
    assert len({r["question"] for r in rows}) == 500  # drawn without replacement
    towns = corpus()
    for row in rows:
        town = towns[int(row["doc_id"])]
        assert isinstance(town, Town) and town.name == row["entity"] and town.name in str(row["question"])
        assert row["answer"] == town.answer(str(row["attribute"])) and str(row["answer"]) in town.text
    assert Counter(r["attribute"] for r in rows).keys() == QUESTIONS.keys()
    every = make_facts_rows(len(QUESTIONS) * N_DOCS + 10, seed=0)
    assert len({r["question"] for r in every}) == len(QUESTIONS) * N_DOCS  # all of them, then a reshuffle


@pytest.mark.parametrize("n_docs", [1, 10_000])
def test_corpus_size_is_bounded(n_docs):
    with pytest.raises(ValueError, match="n_docs"):
        corpus(n_docs)


def test_facts_is_a_generated_task():
    cfg = DataConfig(task="facts", num_prompts=40, seed=1)
    rows = load_task(cfg)
    assert rows == make_facts_rows(40, 1)
    held = load_heldout(cfg, 20, seed=0)
    assert held is not None
    held_rows, where = held
    assert len(held_rows) == 20 and "20 facts problems no training row holds" in where
    assert not {r["question"] for r in held_rows} & {r["question"] for r in rows}
    with pytest.raises(ConfigError, match=r"data\.ops applies to"):
        DataConfig(task="facts", ops=[1])
    with pytest.raises(ValueError, match="num_prompts"):
        make_facts_rows(0, seed=0)
