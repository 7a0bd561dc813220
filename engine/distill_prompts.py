"""The project's own distillation prompt set: deterministic, template-generated, no external data.

Prompts cover the task kinds the drafter will meet (chat, explanation, code, math, summarise,
rewrite, lists, letters, comparisons) with slots filled from small hand-written word lists, so
the set is large and varied yet reproducible from a seed. ``is_eval_prompt`` keeps it disjoint
from the evaluation prompts in assets/prompts/bench.json. Licence: written for this project
(Apache-2.0, like the repository).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TOPICS = [
    "photosynthesis", "black holes", "the water cycle", "volcanoes", "the immune system", "electric cars", "compound interest",
    "the French Revolution", "machine learning", "coral reefs", "the printing press", "vaccines", "plate tectonics",
    "the internet", "bees", "renewable energy", "the Roman Empire", "DNA", "climate change", "sleep", "coffee", "chess",
    "the stock market", "recycling", "earthquakes", "the moon landing", "tides", "gravity", "magnets", "rainforests",
    "the human heart", "antibiotics", "solar panels", "deserts", "glaciers", "the Olympic Games", "jazz music", "origami",
    "bread baking", "public libraries", "bicycles", "trains", "the Silk Road", "submarines", "honey", "lighthouses",
    "time zones", "hurricanes", "penguins", "the periodic table", "blockchains", "password security", "meditation",
]
AUDIENCES = ["a ten-year-old", "a busy manager", "a high-school student", "a beginner", "an expert", "my grandmother"]
CODE_TASKS = [
    "reverses a linked list", "checks whether a number is prime", "counts the words in a text file", "merges two sorted lists",
    "computes the factorial of n", "removes duplicates from a list while keeping order", "finds the largest element in a list",
    "converts Celsius to Fahrenheit", "validates an email address with a regular expression", "computes the GCD of two numbers",
    "flattens a nested list", "returns the n-th Fibonacci number iteratively", "parses a CSV line into fields",
    "implements binary search", "counts vowels in a string", "sorts a list of dictionaries by a key", "reads a JSON file",
    "checks if two strings are anagrams", "rotates a matrix by 90 degrees", "implements a simple stack class",
]
LANGUAGES = ["Python", "JavaScript", "Python", "Rust", "Go", "C", "Python", "TypeScript", "Java", "Bash"]
ITEMS = ["apples", "books", "tickets", "pencils", "eggs", "chairs", "marbles", "stamps", "cookies", "bottles"]
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kofi", "Lena"]
THINGS = ["a tent", "a laptop", "a bicycle", "a garden", "a cover letter", "a birthday party", "a study plan", "a budget",
          "a presentation", "a road trip", "a small business", "a podcast", "a vegetable soup", "a morning routine"]
TONES = ["more formal", "friendlier", "shorter", "more persuasive", "simpler", "more polite", "more enthusiastic"]
SENTENCES = [
    "The meeting moved to Thursday because the room was booked, so please update your calendars and bring the report.",
    "Our team finished the project early, and the client said the new design works much better than the old one.",
    "The store will close at six today for inventory, and it will open again tomorrow at nine as usual.",
    "I can't come to practice this week since my car broke down, but I will practice at home every evening.",
    "The new software update fixes the login bug, makes the app faster, and adds a dark mode that many users asked for.",
    "Please remember that the deadline for the grant application is Friday and that late applications are not accepted.",
    "We planted twenty trees in the park on Saturday, and the volunteers said they want to do it again next spring.",
    "The train was late again this morning, so I missed the first part of the lecture and had to borrow notes.",
]


def _passage(rng: random.Random) -> str:
    return " ".join(rng.sample(SENTENCES, k=rng.randint(3, 5)))


def make_prompt(rng: random.Random) -> dict[str, str]:
    kind = rng.choice(["explain", "explain", "code", "code", "math", "summarise", "rewrite", "list", "letter", "compare", "howto", "chat"])
    t = rng.choice(TOPICS)
    if kind == "explain":
        text = rng.choice([f"Explain {t} to {rng.choice(AUDIENCES)}.", f"What is {t}? Answer in a short paragraph.",
                           f"Why does {t} matter? Give three reasons.", f"Describe how {t} works, step by step."])
    elif kind == "code":
        lang = rng.choice(LANGUAGES)
        text = rng.choice([f"Write a {lang} function that {rng.choice(CODE_TASKS)}.",
                           f"Write a {lang} function that {rng.choice(CODE_TASKS)}, with a short docstring and an example.",
                           f"Explain what this {lang} task involves and then write code for it: a function that {rng.choice(CODE_TASKS)}."])
    elif kind == "math":
        a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(2, 9)
        n1, n2, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
        text = rng.choice([f"{n1} has {a} {item} and buys {b} more, then gives {c} to {n2}. How many {item} does {n1} have now? Show your steps.",
                           f"What is {a} times {b} plus {c}? Explain the calculation.",
                           f"A car travels {a * 10} km in {c} hours. What is its average speed? Show your work.",
                           f"If {c} friends share {a * c} {item} equally, how many does each get?",
                           f"Solve for x: {c}x + {a} = {a + c * b}. Explain each step."])
    elif kind == "summarise":
        text = f"Summarise the following text in two sentences.\n\n{_passage(rng)}"
    elif kind == "rewrite":
        text = f"Rewrite this text to make it {rng.choice(TONES)}, keeping every fact:\n\n{_passage(rng)}"
    elif kind == "list":
        text = rng.choice([f"List five facts about {t}.", f"Give me a checklist for planning {rng.choice(THINGS)}.",
                           f"Name four common misconceptions about {t} and correct them."])
    elif kind == "letter":
        text = rng.choice([f"Write a short email to {rng.choice(NAMES)} asking for help with {rng.choice(THINGS)}.",
                           f"Write a polite message declining an invitation to talk about {t}.",
                           f"Draft a thank-you note to a colleague who helped with {rng.choice(THINGS)}."])
    elif kind == "compare":
        t2 = rng.choice([x for x in TOPICS if x != t])
        text = f"Compare {t} and {t2}: how are they similar and how are they different?"
    elif kind == "howto":
        text = rng.choice([f"How do I get started with {rng.choice(THINGS)}?", f"Give step-by-step instructions for {rng.choice(THINGS)}."])
    else:
        text = rng.choice([f"I'm curious about {t}. What should I read first?", f"Tell me something surprising about {t}.",
                           f"Can you help me understand {t} better?", f"What's a fun fact about {t}?"])
    return {"kind": kind, "text": text}


def eval_texts(path: Path | None = None) -> set[str]:
    p = path or Path(__file__).resolve().parent.parent / "assets" / "prompts" / "bench.json"
    return {x["text"] for x in json.loads(p.read_text())} if p.exists() else set()


def make_prompts(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` distinct prompts (ids p00000..), never an evaluation prompt."""
    rng = random.Random(seed)
    banned = eval_texts()
    out, seen = [], set()
    tries = 0
    while len(out) < n and tries < n * 50:
        tries += 1
        p = make_prompt(rng)
        if p["text"] in seen or p["text"] in banned:
            continue
        seen.add(p["text"])
        out.append({"id": f"p{len(out):05d}", **p})
    return out
