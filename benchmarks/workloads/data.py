"""Seeded synthetic data for the workloads: no downloads, and the same seed gives the same text.

The text is made of templated sentences about invented entities, so a question's answer is in
its context (a 135M model gets some right) and lengths are controlled: what the benchmarks
measure is how the token sequences share prefixes, not the model's knowledge.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

LETTERS = "ABCD"
NAMES = ("Ada Moreno", "Ben Okafor", "Clara Voss", "Dev Raman", "Elena Sato", "Farid Haddad", "Greta Lind",
         "Hugo Brandt", "Iris Kowal", "Jonas Pike", "Kira Nolan", "Liam Ortiz", "Maya Chen", "Nils Berg")  # fmt: skip
CITIES = ("Lisbon", "Oslo", "Toronto", "Nairobi", "Kyoto", "Denver", "Porto", "Tallinn", "Austin", "Dublin")
JOBS = ("nurse", "architect", "data analyst", "teacher", "chef", "pilot", "civil engineer", "librarian")
SKILLS = ("python", "welding", "statistics", "cooking", "drafting", "negotiation", "first aid", "spanish")
NOUNS = ("river", "garden", "engine", "market", "library", "harbor", "forest", "bridge", "tower", "valley",
         "orchard", "station", "museum", "canal", "meadow", "workshop", "lantern", "compass", "quarry", "island")  # fmt: skip
ADJECTIVES = ("quiet", "ancient", "busy", "narrow", "golden", "hidden", "rusty", "bright", "steep", "famous",
              "crowded", "distant", "gentle", "broken", "modern", "frozen")  # fmt: skip
VERBS = ("visited", "painted", "measured", "repaired", "described", "crossed", "mapped", "guarded", "cleaned",
         "studied", "photographed", "restored")  # fmt: skip
SUBJECTS = ("metallurgy", "astronomy", "botany", "geology", "pharmacology", "oceanography", "linguistics", "economics")
ATTRIBUTES = ("melting point", "discovery year", "density index", "hardness grade", "catalogue number",
              "half-life in days", "boiling point", "refractive score")  # fmt: skip
SYLLABLES = ("va", "ro", "ke", "li", "zan", "tor", "mi", "dex", "qu", "sel", "nor", "bi", "fa", "lum")

ACTIVITIES = {
    "bakes bread": ("measures the flour", "kneads the dough on the counter", "lets the dough rise under a towel",
                    "shapes the loaf", "slides the tray into the hot oven", "slices the warm bread"),
    "washes a car": ("fills a bucket with soapy water", "sprays the wheels with a hose", "scrubs the roof with a sponge",
                     "rinses the soap off the doors", "dries the windows with a cloth", "polishes the mirrors"),
    "paints a fence": ("sands the old boards", "stirs the can of paint", "dips the brush into the paint",
                       "paints the first row of boards", "adds a second coat", "cleans the brush in water"),
    "plays tennis": ("bounces the ball twice", "tosses the ball up to serve", "runs to the net",
                     "returns a fast backhand", "wins the long rally", "shakes hands with the opponent"),
    "plants a tree": ("digs a wide hole", "loosens the roots of the sapling", "sets the tree in the hole",
                      "fills the hole with soil", "presses the soil down", "waters the young tree"),
    "changes a tire": ("loosens the lug nuts", "raises the car with a jack", "pulls off the flat tire",
                       "mounts the spare tire", "tightens the lug nuts", "lowers the car to the ground"),
    "makes tea": ("boils water in a kettle", "warms the teapot", "spoons the leaves into the pot",
                  "pours the hot water over the leaves", "waits for the tea to steep", "pours the tea into a cup"),
    "climbs a wall": ("chalks both hands", "ties the rope to the harness", "grabs the first hold",
                      "pulls up to a narrow ledge", "reaches the top of the wall", "rappels back down"),
}  # fmt: skip


def words(rng: random.Random, n: int) -> str:
    pool = NOUNS + ADJECTIVES + VERBS + ("the", "a", "and", "of", "with", "near", "after")
    return " ".join(rng.choice(pool) for _ in range(n))


def sentence(rng: random.Random) -> str:
    name = rng.choice(NAMES).split()[0]
    return (f"{name} {rng.choice(VERBS)} the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} near the "
            f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} in {rng.choice(CITIES)}.")  # fmt: skip


def paragraph(rng: random.Random, sentences: int) -> str:
    """About 17 tokens a sentence."""
    return " ".join(sentence(rng) for _ in range(sentences))


# ---- few-shot multiple choice (MMLU-like) ---------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    entity: str
    attribute: str
    value: int

    def statement(self) -> str:
        return f"The {self.attribute} of {self.entity} is {self.value}."


def _entity(rng: random.Random, kind: str) -> str:
    name = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
    return f"{kind} {name}-{rng.randint(10, 99)}"


def facts_about(rng: random.Random, subject: str, n: int) -> list[Fact]:
    kind = {"metallurgy": "alloy", "astronomy": "star", "botany": "fern", "geology": "mineral"}.get(subject, "compound")
    return [Fact(_entity(rng, kind), rng.choice(ATTRIBUTES), rng.randint(100, 999)) for _ in range(n)]


def multiple_choice(rng: random.Random, fact: Fact) -> tuple[str, str]:
    """(question text ending in 'Answer:', correct letter)."""
    options = {fact.value}
    while len(options) < 4:
        options.add(fact.value + rng.choice((-1, 1)) * rng.randint(7, 150))
    ordered = rng.sample(sorted(options), 4)
    lines = [f"Question: What is the {fact.attribute} of {fact.entity}?"]
    lines += [f"{letter}. {value}" for letter, value in zip(LETTERS, ordered)]
    return "\n".join(lines) + "\nAnswer:", LETTERS[ordered.index(fact.value)]


@dataclass(frozen=True)
class McSubject:
    name: str
    preamble: str  # reference notes + 5 answered examples (~1,100 tokens)
    questions: tuple[tuple[str, str], ...]  # (question, answer letter)


def mc_subject(seed: int, subject: str, questions: int, notes: int = 48, shots: int = 5) -> McSubject:
    rng = random.Random(seed)
    facts = facts_about(rng, subject, notes)
    examples = [multiple_choice(rng, f) for f in facts[:shots]]
    preamble = (f"The following are multiple choice questions (with answers) about {subject}. "
                "The reference notes hold every answer.\n\nReference notes:\n"
                + "\n".join(f.statement() for f in facts) + "\n\n"
                + "".join(f"{q} {a}\n\n" for q, a in examples))  # fmt: skip
    asked = [multiple_choice(rng, rng.choice(facts[shots:])) for _ in range(questions)]
    return McSubject(subject, preamble, tuple(asked))


# ---- sentence completion (HellaSwag-like) --------------------------------------------------------


@dataclass(frozen=True)
class Completion:
    context: str
    endings: tuple[str, ...]
    label: int


def completion(rng: random.Random) -> Completion:
    activity = rng.choice(sorted(ACTIVITIES))
    steps = ACTIVITIES[activity]
    i = rng.randrange(len(steps) - 1)
    name = rng.choice(NAMES).split()[0]
    context = f"{name} {activity} in the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}. First {name} {steps[i]}, then"
    others = [a for a in sorted(ACTIVITIES) if a != activity]
    wrong = [rng.choice(ACTIVITIES[a]) for a in rng.sample(others, 3)]
    endings = [steps[i + 1]] + wrong
    rng.shuffle(endings)
    return Completion(context, tuple(" " + e + "." for e in endings), endings.index(steps[i + 1]))


def completion_preamble(seed: int, shots: int = 20) -> str:
    rng = random.Random(seed)
    examples = [completion(rng) for _ in range(shots)]
    head = "Complete each description with the most plausible ending.\n\n"
    return head + "".join(f"{c.context}{c.endings[c.label]}\n\n" for c in examples)


# ---- documents -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Person:
    name: str
    age: int
    city: str
    job: str
    years: int
    remote: bool
    skills: tuple[str, ...]


def person(rng: random.Random) -> Person:
    age = rng.randint(24, 64)
    return Person(rng.choice(NAMES), age, rng.choice(CITIES), rng.choice(JOBS), rng.randint(1, age - 20),
                  rng.random() < 0.5, tuple(rng.sample(SKILLS, 3)))  # fmt: skip


def biography(rng: random.Random, p: Person, filler_sentences: int) -> str:
    """A ~(60 + 17 x filler) token document stating every field of `p` among filler."""
    facts = [
        f"{p.name} is {p.age} years old and lives in {p.city}.",
        f"{p.name.split()[0]} has worked as a {p.job} for {p.years} years.",
        f"{'Most days the work is done remotely.' if p.remote else 'The job requires being on site every day.'}",
        f"Colleagues mention {', '.join(p.skills[:-1])} and {p.skills[-1]} as strengths.",
    ]
    filler = [sentence(rng) for _ in range(filler_sentences)]
    for fact in facts:
        filler.insert(rng.randrange(len(filler) + 1), fact)
    return " ".join(filler)


def word_problem(rng: random.Random, context_sentences: int) -> tuple[str, int]:
    """(a short arithmetic story with some distracting context, its answer)."""
    name = rng.choice(NAMES).split()[0]
    a, b, c = rng.randint(12, 60), rng.randint(2, 9), rng.randint(3, 20)
    story = paragraph(rng, context_sentences)
    question = (f"{story} {name} packs {a} boxes with {b} jars each, then gives away {c} jars. "
                f"How many jars does {name} have left?")  # fmt: skip
    return question, a * b - c
