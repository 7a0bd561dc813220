"""Held-out copy-task prompts over passages written for this evaluation (session 26): text no
drafter has seen as a reply, under the copy instructions of copy_prompts.py. 16 passages x 3
instructions = 48 prompts, for `distill data --prompts` (replies used only to evaluate).

    python copy_eval_prompts.py OUT.json
"""
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from copy_prompts import AUDIENCE, INSTR, TONES  # noqa: E402

PASSAGES = [
    "The village bakery opens at six every morning, and by seven there is usually a queue outside. Its owner, Marta, "
    "still uses her grandmother's recipe for rye bread. On Fridays she bakes a sweet loaf with raisins that sells out by noon.",
    "Our office will move to the fourth floor of the Lindgren building in May. The new space has two meeting rooms, a "
    "small kitchen and a quiet room for phone calls. Parking is available in the garage across the street for a monthly fee.",
    "Octopuses have three hearts and blue blood. Two of the hearts pump blood to the gills, while the third pumps it to "
    "the rest of the body. They can change the colour and texture of their skin in less than a second to hide from predators.",
    "The city council voted to close Harbour Road to cars on Sundays during the summer. Cyclists, walkers and street "
    "vendors will be able to use the whole road from ten in the morning until six in the evening. Buses will take the coastal route instead.",
    "Regular stretching keeps muscles flexible and reduces the risk of injury. Experts suggest holding each stretch for "
    "about thirty seconds without bouncing. Stretching after a short warm-up is more effective than stretching cold muscles.",
    "The museum's new exhibition shows tools used by farmers two hundred years ago. Visitors can try a hand plough and "
    "grind wheat with a stone mill. The exhibition runs until October, and entry is free for children under twelve.",
    "Our internet provider will carry out maintenance on Tuesday night between one and four in the morning. During this "
    "time the connection may drop for a few minutes at a time. No action is needed, and the service will restart on its own.",
    "Honeybees communicate the location of flowers with a waggle dance. The angle of the dance shows the direction of the "
    "food relative to the sun, and its length shows the distance. Other bees follow the dancer and then fly straight to the flowers.",
    "The school will hold its science fair on the twelfth of March in the main hall. Each class will present one project, "
    "and parents are welcome from two o'clock. Prizes will be given for the most creative idea and the clearest explanation.",
    "A good night's sleep helps the brain store what we learned during the day. Adults need seven to nine hours, while "
    "teenagers need a little more. Screens before bed can delay sleep, because their light tells the body it is still daytime.",
    "The hiking trail to Eagle Lake is eight kilometres long and climbs about four hundred metres. It is well marked, but "
    "the last part is steep and rocky. Hikers should bring water, a warm layer and a map, since there is no phone signal near the lake.",
    "Our online store now offers free delivery on orders over forty euros. Orders placed before noon are shipped the same "
    "day. Customers can return any item within thirty days, and the return label is included in the package.",
    "Volcanic soil is often very fertile because it is rich in minerals. That is why farms can be found on the slopes of "
    "active volcanoes despite the danger. Coffee, grapes and many vegetables grow especially well in such soil.",
    "The library's book club meets on the last Thursday of every month at seven in the evening. This month the group will "
    "discuss a novel about a family of lighthouse builders. New members are welcome, and tea and biscuits are provided.",
    "Electric scooters can now be rented at twenty stations around the city. Riders pay a small fee to unlock a scooter "
    "and then a few cents for every minute. Helmets are recommended, and riding on the pavement is not allowed.",
    "The river festival will take place on the first weekend of August. There will be boat races in the morning, live "
    "music in the afternoon and fireworks over the water at ten. The old bridge will be closed to traffic during the fireworks.",
]


def main():
    rng = random.Random(2026)
    out = []
    for i, p in enumerate(PASSAGES):
        for j, instr in enumerate(rng.sample(INSTR, 3)):
            text = instr.format(p=p, n=rng.choice(["two", "three"]), tone=rng.choice(TONES), aud=rng.choice(AUDIENCE))
            out.append({"name": f"copyeval{i:02d}{j}", "text": text})
    Path(sys.argv[1]).write_text(json.dumps(out, indent=0) + "\n")
    print(len(out), "prompts", file=sys.stderr)


if __name__ == "__main__":
    main()
