"""A fixed encyclopedia of fictional towns and questions about them (``data.task=facts``).

The facts are made up (names are seeded syllable combinations, years and numbers are drawn), so a language
model cannot know an answer from pretraining: it has to look it up, which is what the retrieval environment
(``relayrl.envs.retrieval``) offers. One document per town, a few sentences::

    Velmora is a town in the Quessar region, founded in 1637. It lies on the river Dranel and is home to
    12,480 people. The mayor of Velmora is Ilsa Brokkan. The town is known for its copper. It is 35 km from
    Tamwen.

The corpus depends on nothing but the module constant ``SEED`` (and ``n_docs``), so every process (driver,
rollout actors, reward workers) builds the same documents; ``corpus`` caches it per process. A question row
is::

    {"question": "In which year was Velmora founded?", "answer": "1637", "doc_id": 17,
     "entity": "Velmora", "attribute": "founded"}

``make_facts_rows`` draws (town, attribute) pairs without replacement, so ``n`` rows hold ``min(n, 6 * n_docs)``
distinct questions (1800 for the default corpus): a training set smaller than that leaves fresh questions for
the held-out split (``relayrl.data.load_heldout``).
"""

from __future__ import annotations

import functools
import itertools
import random
from dataclasses import dataclass

SEED = "relayrl-facts/v1"
"""Seeds the corpus. Changing it changes every document and answer: bump the suffix, never reuse one."""
N_DOCS = 300
"""Towns in the default corpus."""
MAX_DOCS = 5000
"""Upper bound on ``n_docs`` (the syllables below give ~28,000 distinct names; far fewer keeps draws quick)."""

SYLLABLES = (
    "bel", "bra", "cor", "dra", "el", "fen", "gar", "hal", "is", "jor", "kal", "lor", "mor", "nel", "or",
    "pel", "quin", "ras", "sel", "tam", "ul", "vel", "wen", "yth", "zar", "ka", "mi", "no", "ta", "ve",
)  # fmt: skip
"""Building blocks of every made-up name: two or three of them, capitalised (``Velmora`` = vel + mo + ra)."""
EXPORTS = (
    "copper", "wool", "salt", "timber", "glassware", "cheese", "rope", "barley", "paper", "clocks", "honey",
    "linen", "pottery", "iron", "olives", "leather", "silk", "cider", "bells", "dyes",
)  # fmt: skip
"""What a town is known for: real words, shared between towns (the name is what identifies a town)."""
N_RIVERS, N_REGIONS, N_FIRST_NAMES = 60, 15, 40
"""Sizes of the shared pools of made-up rivers, regions and first names."""

QUESTIONS = {
    "founded": "In which year was {name} founded?",
    "population": "What is the population of {name}?",
    "river": "Which river flows through {name}?",
    "mayor": "Who is the mayor of {name}?",
    "region": "In which region is {name}?",
    "export": "What is {name} known for?",
}
"""One question per attribute of a town; its answer is the attribute's value as the document writes it."""


@dataclass(frozen=True)
class Town:
    """One fictional town: its attributes and the document that states them."""

    doc_id: int
    name: str
    founded: str
    population: str
    river: str
    mayor: str
    region: str
    export: str
    neighbour: str
    distance_km: int
    text: str

    def answer(self, attribute: str) -> str:
        """The value of ``attribute`` (a key of ``QUESTIONS``) as the document writes it."""
        return str(getattr(self, attribute))


class _Names:
    """Made-up capitalised names, each drawn at most once: no two entities (or pools) share a name."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.used = rng, set[str]()

    def draw(self) -> str:
        while True:
            parts = self.rng.choices(SYLLABLES, k=self.rng.choice((2, 2, 3)))
            name = "".join(parts).capitalize()
            if name not in self.used and all(a != b for a, b in itertools.pairwise(parts)):  # no "Ythnelnel"
                self.used.add(name)
                return name


@functools.lru_cache(maxsize=4)
def corpus(n_docs: int = N_DOCS) -> tuple[Town, ...]:
    """The first ``n_docs`` towns of the fixed corpus (the same in every process; cached)."""
    if not 2 <= n_docs <= MAX_DOCS:
        raise ValueError(f"facts corpus needs 2 <= n_docs <= {MAX_DOCS}, got {n_docs}")
    rng = random.Random(SEED)
    names = _Names(rng)
    rivers = [names.draw() for _ in range(N_RIVERS)]
    regions = [names.draw() for _ in range(N_REGIONS)]
    first_names = [names.draw() for _ in range(N_FIRST_NAMES)]
    town_names = [names.draw() for _ in range(n_docs)]
    return tuple(_town(rng, i, town_names, rivers, regions, first_names, names) for i in range(n_docs))


def _town(
    rng: random.Random,
    i: int,
    town_names: list[str],
    rivers: list[str],
    regions: list[str],
    first_names: list[str],
    names: _Names,
) -> Town:
    """Town ``i``: its attributes drawn from ``rng``, its neighbour any other town (a distractor: a search for a
    town's name also finds the documents that mention it as a neighbour)."""
    name = town_names[i]
    attrs = {
        "founded": str(rng.randint(1150, 1950)),
        "population": f"{rng.randint(800, 250_000):,}",
        "river": rng.choice(rivers),
        "mayor": f"{rng.choice(first_names)} {names.draw()}",
        "region": rng.choice(regions),
        "export": rng.choice(EXPORTS),
    }
    other = rng.randrange(len(town_names) - 1)
    neighbour = town_names[other + (other >= i)]
    distance = rng.randint(3, 120)
    return Town(
        i, name, **attrs, neighbour=neighbour, distance_km=distance, text=_text(rng, name, attrs, neighbour, distance)
    )


def _text(rng: random.Random, name: str, a: dict[str, str], neighbour: str, distance: int) -> str:
    """The document: the same facts in one of a few phrasings per sentence, so documents differ in shape too."""
    sentences = [
        rng.choice(
            (
                f"{name} is a town in the {a['region']} region, founded in {a['founded']}.",
                f"Founded in {a['founded']}, {name} is a town of the {a['region']} region.",
            )
        ),
        rng.choice(
            (
                f"It lies on the river {a['river']} and is home to {a['population']} people.",
                f"The river {a['river']} flows through the town, which has a population of {a['population']}.",
            )
        ),
        rng.choice((f"The mayor of {name} is {a['mayor']}.", f"{a['mayor']} is the mayor of {name}.")),
        rng.choice((f"The town is known for its {a['export']}.", f"{name} is known for its {a['export']}.")),
        f"It is {distance} km from {neighbour}.",
    ]
    return " ".join(sentences)


def make_facts_rows(n: int, seed: int | str, n_docs: int = N_DOCS) -> list[dict[str, str | int]]:
    """``n`` question rows about the corpus, seeded by ``seed``: (town, attribute) pairs in a seeded shuffle,
    reshuffled each time all ``6 * n_docs`` questions have been drawn."""
    if n <= 0:
        raise ValueError(f"facts needs num_prompts > 0, got {n}; set data.num_prompts")
    towns = corpus(n_docs)
    rng = random.Random(f"relayrl-facts-questions/{seed}")
    pairs = [(town, attribute) for town in towns for attribute in QUESTIONS]
    rows: list[dict[str, str | int]] = []
    while len(rows) < n:
        rng.shuffle(pairs)
        rows += [_row(town, attribute) for town, attribute in pairs[: n - len(rows)]]
    return rows


def _row(town: Town, attribute: str) -> dict[str, str | int]:
    return {
        "question": QUESTIONS[attribute].format(name=town.name),
        "answer": town.answer(attribute),
        "doc_id": town.doc_id,
        "entity": town.name,
        "attribute": attribute,
    }
