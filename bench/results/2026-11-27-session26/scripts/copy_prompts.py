"""Copy-task prompts with varied passages (session 26).

The template set's summarise/rewrite prompts draw their passages from 8 fixed sentences, so a
drafter trained on their replies memorises those sentences instead of learning to copy from the
context, and fails on new passages (session 22: 25% / 23% agreement on the evaluation prompts'
summarise / rewrite replies). Here the passages are the opening sentences of SmolLM2's own prose
replies in the training sets (thousands of topics), under varied copy-task instructions.

    python copy_prompts.py N SEED OUT.json   -> a JSON list of {name, text} for `distill data --prompts`
"""
import json
import lzma
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from engine.distill_prompts import eval_texts  # noqa: E402

PROSE_KINDS = {"self", "explain", "chat", "story", "advice", "howto", "compare", "letter", "define"}
TONES = ["more formal", "friendlier", "more neutral", "more confident", "more polite", "more enthusiastic", "plainer",
         "more professional", "warmer", "more concise"]
AUDIENCE = ["a child", "a beginner", "a busy reader", "a non-native English speaker", "a teenager"]
INSTR = [
    "Summarise the following text in {n} sentences, reusing its wording where you can.\n\n{p}",
    "Summarise this in one or two sentences:\n\n{p}",
    "Give a short summary of this passage:\n\n{p}",
    "Rewrite this paragraph in a {tone} tone, keeping every fact:\n\n{p}",
    "Rewrite the following to be {tone}:\n\n{p}",
    "Rewrite this text so that {aud} could understand it, keeping its meaning:\n\n{p}",
    "Paraphrase the following paragraph:\n\n{p}",
    "Turn this text into a bulleted list of its main points:\n\n{p}",
    "Extract the key facts from this text as a numbered list:\n\n{p}",
    "Shorten this text to about half its length, keeping the key facts:\n\n{p}",
    "Fix any grammar or spelling mistakes in this text and return the corrected version:\n\n{p}",
    "Suggest a title for this paragraph, then repeat the paragraph under it:\n\n{p}",
    "Here is a text:\n\n{p}\n\nWhat is it mainly about? Answer using phrases from the text.",
    "Read the passage and answer: what is its most important point?\n\n{p}",
    "Continue this text with two more sentences in the same style:\n\n{p}",
    "Translate this paragraph into plain, simple English:\n\n{p}",
]
FILLER = re.compile(r"(Sure|Absolutely|Of course|Certainly|Great|Hello|Hi|Yes|No problem|I'd be|I would be|I'm happy|I am happy)\b", re.I)
SENT = re.compile(r"(?<=[.!?])\s+")


def passages(paths, rng):
    out = []
    for path in paths:
        opener = lzma.open if path.suffix == ".xz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                if r.get("kind") not in PROSE_KINDS:
                    continue
                text = r["text"].strip()
                if any(c in text for c in "#*`|") or re.search(r"^\s*\d+\.", text, re.M) or "\n" in text[:200]:
                    continue  # markdown, lists, code: keep prose paragraphs
                sents = [s for s in SENT.split(text.split("\n\n")[0]) if s]
                while sents and FILLER.match(sents[0]):
                    sents = sents[1:]  # "Sure, I'd be happy to help." is not content
                if len(sents) < 3:
                    continue
                k = rng.randint(3, min(6, len(sents)))
                p = " ".join(sents[:k])
                if 35 <= len(p.split()) <= 130 and p[-1] in ".!?":
                    out.append(p)
    return sorted(set(out))


def main():
    n, seed, dst = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    rng = random.Random(seed)
    root = Path(__file__).resolve().parents[4] / "assets" / "distill"
    pool = passages([root / "smollm2" / "responses.jsonl", root / "smollm2-gpu" / "responses.jsonl.xz"], rng)
    rng.shuffle(pool)
    banned = eval_texts()
    prompts = []
    for i, p in enumerate(pool[:n]):
        t = rng.choice(INSTR).format(p=p, n=rng.choice(["two", "three"]), tone=rng.choice(TONES), aud=rng.choice(AUDIENCE))
        if t not in banned:
            prompts.append({"name": f"c{i:05d}", "text": t})
    dst.write_text(json.dumps(prompts, indent=0) + "\n")
    print(f"{len(pool)} passages, {len(prompts)} prompts -> {dst}", file=sys.stderr)


if __name__ == "__main__":
    main()
