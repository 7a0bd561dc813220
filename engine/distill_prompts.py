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


# ---- v2: prompts p04000 onwards (the first 4000 stay exactly as above) ------------------------------
V1_SIZE = 4000
TOPICS2 = [
    "the Great Wall of China", "octopuses", "wind turbines", "the water table", "inflation", "rainbows in fog", "volcanic islands",
    "the Internet of Things", "spiders", "the human brain", "nuclear fusion", "tea ceremonies", "migrating birds", "3D printing",
    "the metric system", "the Amazon river", "paper money", "public transport", "composting", "the speed of light", "fungi",
    "ancient Egypt", "video game design", "the ozone layer", "electric guitars", "hydroponics", "the stock exchange", "glass making",
    "first aid", "the Renaissance", "cloud computing", "sharks", "sourdough", "urban gardening", "satellites", "wolves", "pottery",
    "the scientific method", "ocean currents", "credit scores", "the Moon's phases", "bridges", "typography", "wildfires",
    "probability", "microplastics", "the violin", "habit formation", "open-source software", "the Arctic", "dinosaurs",
    "solar eclipses", "batteries", "the Olympic marathon", "map projections", "the immune response to allergies", "kites",
]
CODE_TASKS2 = [
    "counts how often each word appears in a sentence", "checks whether a year is a leap year", "converts a Roman numeral to an integer",
    "returns the second largest number in a list", "capitalises the first letter of every word", "computes the average of a list",
    "checks whether parentheses in a string are balanced", "generates the first n prime numbers", "reverses the words in a sentence",
    "finds the most common character in a string", "converts a list of pairs into a dictionary", "chunks a list into groups of size n",
    "computes compound interest", "removes vowels from a string", "validates a phone number", "transposes a matrix",
    "merges two dictionaries", "finds all even numbers in a list", "implements a queue with two stacks", "counts lines in a file",
    "converts seconds to hours, minutes and seconds", "checks whether a list is sorted", "implements insertion sort",
    "returns the intersection of two lists", "computes the power set of a small list", "formats a number with thousands separators",
]
SENTENCES2 = [
    "The bakery on Main Street now opens at seven, and it sells fresh bread until noon every day except Monday.",
    "Our school will hold its science fair next month, and every class must present at least one experiment.",
    "The river rose by two metres after the storm, so the footpath along the bank is closed until further notice.",
    "Tickets for the concert sold out in one hour, but the band has promised to add a second show in June.",
    "The company will switch to a new email system on Monday, and everyone must reset their password before then.",
    "Volunteers cleaned the beach on Sunday and collected more than three hundred kilograms of plastic waste.",
    "The museum is free on the first Sunday of every month, and children under twelve never pay for entry.",
    "Heavy snow closed the mountain road overnight, and the ski resort asked visitors to take the shuttle bus instead.",
    "The city will repaint the old bridge this summer, which means one lane will be closed for about six weeks.",
    "Our book club chose a mystery novel for March, and the next meeting will take place at the library at six.",
    "The clinic now offers appointments online, so patients no longer need to call during office hours.",
    "Because of the heat wave, the swimming pool will stay open two hours longer every evening this week.",
]
PERSONAS = ["a student", "a teacher", "a nurse", "a small-business owner", "a retiree", "a software developer", "a parent", "a traveller"]


def make_prompt_v2(rng: random.Random) -> dict[str, str]:
    kind = rng.choice(["explain", "explain", "code", "code", "math", "summarise", "rewrite", "list", "letter", "compare", "howto",
                       "chat", "story", "advice", "define"])
    t = rng.choice(TOPICS2 + TOPICS)
    if kind == "explain":
        text = rng.choice([f"Explain {t} in simple words.", f"How does {t} work? Keep it short.", f"What should everyone know about {t}?",
                           f"Give a brief overview of {t} for {rng.choice(AUDIENCES)}.", f"What are the main ideas behind {t}?"])
    elif kind == "code":
        lang = rng.choice(LANGUAGES)
        task = rng.choice(CODE_TASKS2 + CODE_TASKS)
        text = rng.choice([f"Write a {lang} function that {task}.", f"Show me {lang} code that {task}, and explain it briefly.",
                           f"How would you write a function in {lang} that {task}? Include a test."])
    elif kind == "math":
        a, b, c = rng.randint(3, 90), rng.randint(2, 50), rng.randint(2, 12)
        n1, item = rng.choice(NAMES), rng.choice(ITEMS)
        text = rng.choice([f"{n1} saves {a} dollars a week for {c} weeks and then spends {b} dollars. How much is left? Show your steps.",
                           f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
                           f"What is {c * 10}% of {a * 10}? Explain how you got it.",
                           f"A box holds {c} {item}. How many boxes do you need for {a * c + b % c} {item}?",
                           f"Convert {a} kilometres per hour to metres per second, showing the steps."])
    elif kind == "summarise":
        text = rng.choice(["Summarise this in one or two sentences:", "Give a short summary of the text below.",
                           "What are the key points of this text?"]) + "\n\n" + " ".join(rng.sample(SENTENCES2 + SENTENCES, k=rng.randint(3, 5)))
    elif kind == "rewrite":
        text = f"Rewrite the following to be {rng.choice(TONES)}:\n\n" + " ".join(rng.sample(SENTENCES2 + SENTENCES, k=rng.randint(2, 4)))
    elif kind == "list":
        text = rng.choice([f"List three pros and three cons of {t}.", f"Give five tips for {rng.choice(PERSONAS)} interested in {t}.",
                           f"What are the steps to prepare {rng.choice(THINGS)}? Use a numbered list."])
    elif kind == "letter":
        text = rng.choice([f"Write a short message to {rng.choice(NAMES)} inviting them to a talk about {t}.",
                           f"Write an email to my manager asking for a day off to work on {rng.choice(THINGS)}.",
                           f"Write a friendly reminder to {rng.choice(NAMES)} about {rng.choice(THINGS)}."])
    elif kind == "compare":
        t2 = rng.choice([x for x in TOPICS2 if x != t])
        text = rng.choice([f"What is the difference between {t} and {t2}?", f"Which is more interesting to learn about, {t} or {t2}, and why?"])
    elif kind == "howto":
        text = rng.choice([f"How can {rng.choice(PERSONAS)} learn about {t}?", f"What is the best way to start {rng.choice(THINGS)}?"])
    elif kind == "story":
        text = rng.choice([f"Write a short story about {rng.choice(NAMES)} and {t}.", f"Write a four-line poem about {t}."])
    elif kind == "advice":
        text = f"I'm {rng.choice(PERSONAS)} and I want to understand {t}. Where should I begin?"
    elif kind == "chat":
        text = rng.choice([f"Hi! Do you know anything about {t}?", f"I just read about {t}. Can we talk about it?",
                           f"What do you think is the most important thing about {t}?"])
    else:
        text = rng.choice([f"Define {t} in one sentence, then give an example.", f"What does the term '{t}' mean?"])
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
    rng2 = random.Random(seed + 1_000_003)
    while len(out) < n and tries < n * 50:
        tries += 1
        p = make_prompt(rng) if len(out) < V1_SIZE else make_prompt_v2(rng2)
        if p["text"] in seen or p["text"] in banned:
            continue
        seen.add(p["text"])
        out.append({"id": f"p{len(out):05d}", **p})
    return out
