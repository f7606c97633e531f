#!/usr/bin/env python
"""Build the project's calibration and evaluation data from handwritten material.

Everything in calibration_data/ and eval/ is produced by this script from the handwritten material in
data_sources/ (paragraphs, conversations, code, facts, vocabularies) and the templates below (word problems,
records). Nothing is downloaded. The builder is
seeded, so running it again reproduces the committed JSONL byte for byte:

    .venv/bin/python scripts/build_data.py            # write calibration_data/ and eval/
    .venv/bin/python scripts/build_data.py --check    # rebuild in memory, fail if the files differ
    .venv/bin/python scripts/build_data.py --table    # print counts per domain x length bucket

Disjointness by construction: every pool of handwritten material is split once into a calibration part
and an evaluation part (`_split`), and evaluation samples are only composed from the evaluation part.
As a safety net, an eval sample that still shares a 50-character substring or a 13-word n-gram with any
calibration sample is dropped (the test in tests/test_data_disjoint.py checks the same thing).

Licence: written for this project, Apache-2.0 like the rest of accel.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
DOMAINS = ("chat", "code", "math", "prose", "structured", "multilingual")
TASKS = ("arithmetic", "json_extraction", "multiple_choice", "formatting", "factual")
# Bucket upper bounds in tokens (the last bucket is open-ended); the same as CalibrationConfig's default.
BUCKETS = (64, 256, 1024)
# Calibration samples wanted per length bucket (<=64, 65-256, 257-1024, >1024) in every domain.
CAL_PLAN = (30, 48, 48, 8)
# Eval text samples per bucket: mostly 128-1024 tokens, for perplexity / KL over fixed windows.
EVAL_PLAN = ((128, 256, 10), (257, 1024, 22))
SEED = 20261129
SOURCES = Path(__file__).resolve().parent / "data_sources"


def _source(name: str):
    """Handwritten material from data_sources/<name>.json: a list (its list items as tuples) or a dict."""
    data = json.loads((SOURCES / f"{name}.json").read_text(encoding="utf-8"))
    return [tuple(x) if isinstance(x, list) else x for x in data] if isinstance(data, list) else data


# ----------------------------------------------------------------------------------------------------
# Prose: handwritten paragraphs, each with a one-sentence summary (used for the summarization format).
# ----------------------------------------------------------------------------------------------------
PROSE = _source("prose")

PROSE += [
    ("Bicycles became popular in the 1890s and gave ordinary people, especially women, a new freedom of movement.",
     "The safety bicycle, with two wheels of equal size and a chain driving the rear wheel, appeared in the "
     "1880s, and the invention of the air-filled tyre soon made it comfortable to ride. Within a decade, "
     "cycling clubs were forming across Europe and North America. For many working people, a bicycle was "
     "the first machine that let them travel further than they could walk. Women who took up cycling "
     "pushed for looser, more practical clothing, and the campaigner Susan B. Anthony said the bicycle had "
     "done more to emancipate women than anything else in the world."),
    ("Ants organise their colonies without a leader, using chemical trails and simple rules.",
     "A colony of ants can find the shortest route to food, build nests with ventilation and defend its "
     "territory, yet no single ant is in charge. The queen lays eggs but does not give orders. Instead, "
     "workers follow simple rules and react to chemical signals called pheromones. An ant that finds food "
     "lays a scent trail on the way home; others follow it and reinforce it, while trails to poorer sources "
     "fade. Computer scientists have borrowed the idea to solve routing problems, from delivery vans to "
     "data moving through networks."),
    ("Spices such as pepper and nutmeg were once worth more than gold and drove European voyages to Asia.",
     "In the Middle Ages, pepper, cloves, cinnamon and nutmeg reached Europe after passing through many "
     "hands, and each merchant added to the price. Nutmeg grew only on a few small islands in what is now "
     "Indonesia. The wish to reach these sources directly pushed Portuguese, Spanish, Dutch and English "
     "sailors into long and dangerous voyages. The trade brought great fortunes to some and terrible "
     "violence to the islanders. Today the same spices sit cheaply on supermarket shelves."),
    ("Crossword puzzles first appeared in a New York newspaper in 1913 and quickly became a craze.",
     "The first crossword, called a word-cross, was printed in the New York World in December 1913 by "
     "Arthur Wynne, a journalist from Liverpool. It was shaped like a diamond and had no black squares. "
     "By the 1920s, crosswords were so popular that publishers printed whole books of them and some "
     "libraries complained that readers were wearing out their dictionaries. British papers developed the "
     "cryptic crossword, where every clue is a small riddle combining a definition with wordplay."),
    ("Deserts are defined by how little rain they get, not by heat, so Antarctica is the largest desert.",
     "When people picture a desert, they usually imagine sand dunes under a burning sun. Geographers, "
     "however, define a desert by its rainfall: a place that receives less than about 250 millimetres of "
     "precipitation a year. By that measure, the largest desert on Earth is Antarctica, followed by the "
     "Arctic, and only then the Sahara. Many deserts are rocky rather than sandy, and nights can be "
     "freezing because dry air holds little heat. Plants and animals survive by storing water, staying "
     "underground by day or becoming active only after rare rains."),
    ("Barcodes let shops identify products instantly, and the first scanned item was a pack of chewing gum.",
     "The familiar pattern of black bars on packaging encodes a number that identifies the product. A "
     "scanner reads the widths of the bars and spaces with a beam of light and looks up the price in a "
     "database. The idea was patented in the 1950s, but it only took off once cheap lasers and computers "
     "arrived. In June 1974, a supermarket in Ohio scanned the first product with a universal barcode: a "
     "pack of chewing gum. Square QR codes, which hold much more information, were developed later to track "
     "car parts in Japan."),
    ("Whales evolved from land mammals, and fossils show the transition step by step.",
     "It seems strange that the largest animals in the ocean descend from creatures that walked on land, "
     "but the fossil record is remarkably clear. Around fifty million years ago, small hoofed mammals "
     "related to today's hippos began wading into shallow water to feed. Over millions of years their "
     "descendants grew longer bodies, their nostrils moved towards the top of the head and their back legs "
     "shrank. Some modern whales still carry tiny hip bones inside their bodies, a leftover from their "
     "four-legged ancestors."),
    ("Queues are a small but real part of daily life, and how they are organised changes how fair they feel.",
     "Researchers who study waiting lines have found that people care as much about fairness as about "
     "time. A single queue that feeds several counters feels fairer than separate lines, because nobody "
     "watches a neighbouring line move faster. Waiting also feels shorter when people have something to do "
     "or know how long it will take, which is why some airports put the baggage claim far from the gate and "
     "why theme parks display estimated waiting times. Uncertain waits feel longer than known ones."),
    ("The metric system was created in France in the 1790s to replace a confusing mix of local units.",
     "Before the French Revolution, France used hundreds of different units, and a measure of grain or "
     "cloth could change from one town to the next. Reformers wanted a system based on nature and on "
     "tens. They defined the metre as one ten-millionth of the distance from the North Pole to the equator, "
     "and two surveyors spent years measuring the arc between Dunkirk and Barcelona to fix it. Today the "
     "metre is defined using the speed of light, and almost every country uses the metric system."),
    ("Handwriting by hand may help students remember lecture material better than typing.",
     "Several studies have compared students who took notes on laptops with those who wrote by hand. The "
     "typists recorded more words, often copying the lecture almost word for word. The handwriters, forced "
     "to be selective because they were slower, had to summarise ideas in their own words, and in some "
     "experiments they answered conceptual questions better afterwards. The results are debated and other "
     "studies have found smaller effects, but many teachers now encourage students to think before they "
     "write, whatever tool they use."),
    ("Icebergs are mostly hidden underwater because ice is only slightly less dense than sea water.",
     "Fresh water ice is about ninety percent as dense as sea water, so an iceberg floats with roughly "
     "nine tenths of its volume below the surface. That is why sailors have long feared them: the visible "
     "part gives little idea of the size of the mass beneath. Most icebergs in the North Atlantic break off "
     "glaciers in Greenland and drift south on ocean currents. After the Titanic sank in 1912, countries "
     "set up the International Ice Patrol, which still tracks icebergs near the shipping lanes."),
    ("Pencils contain graphite mixed with clay, not lead, and the mix sets how hard or soft they are.",
     "Despite the name, a lead pencil contains no lead at all. Its core is graphite, a soft form of carbon, "
     "mixed with clay and baked. More clay makes a harder pencil that leaves a light, fine line, marked "
     "with an H; more graphite makes a softer, darker pencil marked with a B. The ordinary school pencil, "
     "HB, sits in the middle. The name comes from the sixteenth century, when a large deposit of graphite "
     "found in England was mistaken for a kind of lead."),
    ("Citizen scientists contribute real data to research by counting birds, classifying galaxies and more.",
     "Not all science happens in laboratories. Every winter, thousands of volunteers count the birds in "
     "their gardens and send the numbers to researchers, who use them to track how populations change. "
     "Online projects ask people to classify images of galaxies, transcribe old weather logs from ships or "
     "spot animals in photos taken by hidden cameras. Volunteers have discovered new planets and rare "
     "types of galaxy this way. The work gives scientists far more eyes than any university could pay "
     "for, and it gives volunteers a real stake in discovery."),
]
# ----------------------------------------------------------------------------------------------------
# Chat: handwritten user requests and assistant replies. Rendered as plain "User: ... / Assistant: ..."
# turns (optionally preceded by a "System: ..." line), not the model's chat template, so the text is
# model-agnostic.
# ----------------------------------------------------------------------------------------------------
SYSTEM_LINES = _source("system_lines")

CHAT = _source("chat")

CHAT += [
    ("How do I politely end a phone call that's going on too long?",
     "Signal the end before you say goodbye, so it doesn't feel abrupt. For example: 'It's been great "
     "catching up. I need to start on dinner soon, so I'll let you go. Let's talk again next week.' "
     "Summarising the next step, like a plan to meet, helps the other person feel the call ended "
     "naturally."),
    ("What's the difference between a virus and a bacterium?",
     "Bacteria are single-celled living organisms that can reproduce on their own; many are harmless or "
     "even helpful, and bacterial infections can often be treated with antibiotics. Viruses are much "
     "smaller and cannot reproduce without getting inside a host cell. Antibiotics do nothing against "
     "viruses, which is why they don't help with a cold or the flu."),
    ("Give me a simple recipe for tomato soup.",
     "Here's an easy one for four people:\n\n1. Soften a chopped onion and two cloves of garlic in olive "
     "oil for five minutes.\n2. Add two tins of chopped tomatoes, 500 ml of vegetable stock and a pinch of "
     "sugar.\n3. Simmer for twenty minutes.\n4. Blend until smooth and season with salt and pepper.\n5. "
     "Stir in a splash of cream or a few basil leaves before serving.\n\nIt goes well with toasted cheese "
     "sandwiches."),
    ("Why do we have leap years?",
     "The Earth takes about 365.24 days to go around the Sun. If every year had 365 days, the calendar "
     "would drift by about a day every four years, and over centuries the seasons would shift. Adding "
     "29 February every four years fixes most of the gap. Years divisible by 100 are skipped unless they "
     "are also divisible by 400, which is why 2000 was a leap year but 1900 was not."),
    ("Can you suggest a few names for a small bakery?",
     "Here are some ideas:\n\n- The Rising Loaf\n- Crumb & Co.\n- Morning Oven\n- Flour Child\n- The Corner "
     "Crust\n\nIf the bakery is known for one thing, such as sourdough or cinnamon rolls, putting it in the "
     "name can help people remember you."),
    ("I'm nervous about flying. Any tips?",
     "That's very common. Some things that help many people:\n\n- Learn a little about how planes work; "
     "turbulence is uncomfortable but normal and planes are built for it.\n- Choose a seat over the wing, "
     "where the ride is smoothest.\n- Breathe slowly: in for four counts, out for six.\n- Bring something "
     "absorbing, such as a film, a puzzle book or a podcast.\n- Tell the cabin crew; they are used to "
     "nervous flyers and will check on you.\n\nIf the fear is strong, short courses for fearful flyers "
     "have good results."),
    ("What does HTTP stand for?",
     "HTTP stands for HyperText Transfer Protocol, the set of rules browsers and web servers use to "
     "exchange pages and data."),
    ("Explain what a mortgage is in simple terms.",
     "A mortgage is a loan used to buy a home. The bank pays most of the price, and you pay the money back "
     "in monthly instalments over many years, usually with interest. The home itself serves as security: "
     "if the payments stop, the lender can take the property to recover the money."),
    ("My tomato plants have yellow leaves at the bottom. Is that bad?",
     "A few yellow leaves at the bottom are often normal, because older leaves get shaded and the plant "
     "lets them go. If the yellowing spreads upward, common causes are overwatering, a lack of nitrogen, "
     "or a fungal disease, especially if the leaves have brown spots. Remove the affected leaves, water at "
     "the base rather than over the foliage, and feed the plants with a tomato fertiliser."),
    ("Write a two-line birthday message for my grandmother.",
     "Happy birthday, Grandma! Thank you for all the stories, the hugs and the best apple cake in the "
     "world. I love you very much."),
    ("How many players are there in a football team?",
     "A football (soccer) team has eleven players on the pitch, including the goalkeeper."),
    ("What is the best way to learn to touch type?",
     "Start with the home row: rest your fingers on A S D F and J K L ;, and learn which finger presses "
     "each key. Use a free typing tutor for fifteen minutes a day, and resist looking at the keyboard, "
     "even if you feel slow at first. Accuracy comes before speed; most people reach their old speed within "
     "a few weeks and then overtake it."),
    ("Can you explain what a 'carbon footprint' means?",
     "A carbon footprint is the total amount of greenhouse gases caused by a person, product or "
     "organisation, usually expressed as tonnes of carbon dioxide equivalent per year. It includes direct "
     "emissions, such as burning petrol in a car, and indirect ones, such as the energy used to make the "
     "food and goods you buy."),
    ("How do I make my cover letter stand out?",
     "Open with a specific reason you want this job at this company, not a generic sentence. Pick two "
     "achievements that match the job description and describe them with concrete results. Keep it under "
     "one page, address it to a named person if you can, and end by saying you'd welcome the chance to "
     "discuss how you could help the team."),
    ("Is it safe to eat raw cookie dough?",
     "It's best to avoid it. Raw flour can carry bacteria such as E. coli, and raw eggs can carry "
     "Salmonella. Some shops sell cookie dough made with heat-treated flour and no eggs, which is meant to "
     "be eaten raw."),
    ("What are three interesting facts about the Moon?",
     "1. The Moon always shows the same face to Earth, because it spins once for every orbit.\n2. It is "
     "slowly moving away from us, by about 3.8 centimetres a year.\n3. Twelve people have walked on it, "
     "all between 1969 and 1972."),
]
SYSTEM_LINES += ["You are a cheerful assistant for a cooking website.", "Reply as a knowledgeable librarian would."]
# ----------------------------------------------------------------------------------------------------
# Code: handwritten functions in several languages. A sample is one or more snippets of one language,
# joined like a source file.
# ----------------------------------------------------------------------------------------------------
CODE = _source("code")

# A short line of context that introduces a file, per language (keeps samples looking like real files).
CODE_HEADERS = _source("code_headers")

CODE += [
    ("python", '''def flatten(nested):
    """Flatten arbitrarily nested lists into one list."""
    out = []
    for item in nested:
        if isinstance(item, list):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out'''),
    ("python", '''import argparse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Resize images in a folder.")
    parser.add_argument("folder", help="folder with the images")
    parser.add_argument("--width", type=int, default=800, help="target width in pixels")
    parser.add_argument("--dry-run", action="store_true", help="only print what would change")
    return parser.parse_args(argv)'''),
    ("javascript", '''function slugify(title) {
  return title
    .toLowerCase()
    .normalize("NFD")
    .replace(/[\\u0300-\\u036f]/g, "")
    .replace(/[^a-z0-9]+/g, "-")
    .replace(/^-+|-+$/g, "");
}'''),
    ("rust", '''pub fn median(values: &mut Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mid = values.len() / 2;
    if values.len() % 2 == 0 {
        Some((values[mid - 1] + values[mid]) / 2.0)
    } else {
        Some(values[mid])
    }
}'''),
    ("go", '''func Reverse(s string) string {
	runes := []rune(s)
	for i, j := 0, len(runes)-1; i < j; i, j = i+1, j-1 {
		runes[i], runes[j] = runes[j], runes[i]
	}
	return string(runes)
}'''),
    ("sql", '''SELECT department, ROUND(AVG(salary), 0) AS avg_salary
FROM employees
GROUP BY department
ORDER BY avg_salary DESC;'''),
    ("c", '''double average(const int *values, size_t n) {
    if (n == 0) return 0.0;
    long sum = 0;
    for (size_t i = 0; i < n; i++) {
        sum += values[i];
    }
    return (double)sum / n;
}'''),
    ("java", '''public static boolean isLeapYear(int year) {
    return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
}'''),
    ("typescript", '''type Result<T> = { ok: true; value: T } | { ok: false; error: string };

export function parseAge(input: string): Result<number> {
  const n = Number.parseInt(input, 10);
  if (Number.isNaN(n) || n < 0 || n > 150) {
    return { ok: false, error: `not a valid age: ${input}` };
  }
  return { ok: true, value: n };
}'''),
    ("bash", '''#!/usr/bin/env bash
# Back up the notes folder with today's date in the archive name.
stamp=$(date +%Y-%m-%d)
tar -czf "notes-$stamp.tar.gz" notes/
echo "saved notes-$stamp.tar.gz"'''),
    ("python", '''from collections import Counter


def most_common_letter(text):
    letters = [c for c in text.lower() if c.isalpha()]
    if not letters:
        return None
    return Counter(letters).most_common(1)[0][0]'''),
    ("javascript", '''const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));'''),
]
# ----------------------------------------------------------------------------------------------------
# Math: worked word problems. Each template is handwritten (story + solution steps); numbers and names
# are drawn by the seeded generator, and every answer is computed, so the arithmetic is always right.
# ----------------------------------------------------------------------------------------------------
NAMES = ["Amara", "Ben", "Chloe", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kofi",
         "Lena", "Mateo", "Nadia", "Oscar", "Priya", "Quentin", "Rosa", "Samir", "Tara", "Uma", "Victor"]


def _m_apples(r):
    n, a, b = r.choice(NAMES), r.randint(12, 60), r.randint(2, 9)
    c = r.randint(1, a - 1)
    return (f"Problem: {n} picks {a} apples and gives {c} of them to a neighbour. Then {n} buys {b} more "
            f"bags with 6 apples in each. How many apples does {n} have now?\n"
            f"Solution: After giving some away, {n} has {a} - {c} = {a - c} apples. The bags hold "
            f"{b} x 6 = {b * 6} apples. In total {a - c} + {b * 6} = {a - c + b * 6}.\n"
            f"Answer: {a - c + b * 6}")


def _m_speed(r):
    v, t = r.choice([40, 45, 50, 60, 72, 80, 90]), r.choice([1.5, 2, 2.5, 3, 4])
    d = v * t
    return (f"A train travels at a steady {v} km/h for {t:g} hours. How far does it go?\n"
            f"Distance equals speed times time, so the train covers {v} x {t:g} = {d:g} km.\n"
            f"The answer is {d:g} km.")


def _m_percent(r):
    price, pct = r.choice([20, 35, 48, 60, 80, 120, 150, 250]), r.choice([10, 15, 20, 25, 30, 40])
    off = price * pct / 100
    return (f"Question: A jacket costs ${price}. It is on sale for {pct}% off. What is the sale price?\n"
            f"Work: {pct}% of {price} is {price} x {pct}/100 = {off:g}. Subtract it from the original price: "
            f"{price} - {off:g} = {price - off:g}.\n"
            f"So the jacket costs ${price - off:.2f}.")


def _m_rectangle(r):
    w, h = r.randint(3, 25), r.randint(3, 25)
    return (f"A rectangular garden is {w} metres long and {h} metres wide. Find its area and the length of "
            f"fence needed to go around it.\n"
            f"Area = length x width = {w} x {h} = {w * h} square metres.\n"
            f"Perimeter = 2 x (length + width) = 2 x ({w} + {h}) = {2 * (w + h)} metres.\n"
            f"The garden covers {w * h} m^2 and needs {2 * (w + h)} m of fence.")


def _m_average(r):
    k = r.randint(4, 6)
    xs = [r.randint(50, 100) for _ in range(k)]
    s = sum(xs)
    n = r.choice(NAMES)
    return (f"{n}'s test scores this term were {', '.join(map(str, xs))}. What is the mean score?\n"
            f"Add the scores: {' + '.join(map(str, xs))} = {s}. There are {k} tests, so the mean is "
            f"{s} / {k} = {s / k:.2f}.\n"
            f"Answer: about {s / k:.1f}")


def _m_linear(r):
    a, x, b = r.randint(2, 9), r.randint(-10, 15), r.randint(-20, 20)
    c = a * x + b
    sign = "+" if b >= 0 else "-"
    return (f"Solve for x: {a}x {sign} {abs(b)} = {c}.\n"
            f"Step 1: move the constant to the right-hand side: {a}x = {c} {'-' if b >= 0 else '+'} {abs(b)} "
            f"= {c - b}.\n"
            f"Step 2: divide both sides by {a}: x = {c - b} / {a} = {x}.\n"
            f"Check: {a} x {x} {sign} {abs(b)} = {c}. Correct, so x = {x}.")


def _m_recipe(r):
    base, want = r.choice([2, 4, 6]), r.choice([3, 5, 8, 9, 10, 12])
    flour = r.choice([150, 200, 240, 300])
    eggs = r.choice([1, 2, 3])
    f2 = flour * want / base
    e2 = eggs * want / base
    return (f"A pancake recipe for {base} people uses {flour} g of flour and {eggs} egg{'s' if eggs > 1 else ''}. "
            f"How much of each is needed for {want} people?\n"
            f"The scale factor is {want} / {base} = {want / base:.3g}. Flour: {flour} x {want / base:.3g} = "
            f"{f2:g} g. Eggs: {eggs} x {want / base:.3g} = {e2:g}, so in practice "
            f"{round(e2 + 0.49)} eggs.\n")


def _m_ages(r):
    a, d = r.randint(6, 15), r.randint(20, 35)
    n1, n2 = r.sample(NAMES, 2)
    y = r.randint(2, 10)
    return (f"{n2} is {d} years older than {n1}. In {y} years, the sum of their ages will be "
            f"{2 * a + d + 2 * y}. How old is {n1} now?\n"
            f"Let {n1}'s age be a. Then {n2} is a + {d}. In {y} years their ages add to "
            f"(a + {y}) + (a + {d} + {y}) = 2a + {d + 2 * y}.\n"
            f"So 2a + {d + 2 * y} = {2 * a + d + 2 * y}, which gives 2a = {2 * a} and a = {a}.\n"
            f"{n1} is {a} years old now and {n2} is {a + d}.")


def _m_fraction(r):
    from fractions import Fraction
    a, b = Fraction(r.randint(1, 5), r.choice([2, 3, 4, 6, 8])), Fraction(r.randint(1, 5), r.choice([3, 4, 5, 10]))
    return (f"Compute {a} + {b} and give the result as a fraction in lowest terms.\n"
            f"Use a common denominator of {a.denominator * b.denominator // __import__('math').gcd(a.denominator, b.denominator)}. "
            f"The sum is {a + b}.\n"
            f"Result: {a + b}")


def _m_shop(r):
    n = r.choice(NAMES)
    items = r.sample([("notebooks", 3), ("pens", 1), ("folders", 2), ("rulers", 2), ("erasers", 1),
                      ("markers", 4), ("calculators", 12)], 3)
    qty = [r.randint(1, 6) for _ in items]
    lines = [f"{q} {name} at ${p} each" for (name, p), q in zip(items, qty)]
    costs = [q * p for (_, p), q in zip(items, qty)]
    paid = ((sum(costs) // 10) + 1) * 10
    return (f"{n} buys {', '.join(lines[:-1])} and {lines[-1]}. {n} pays with ${paid}. How much change is due?\n"
            + "".join(f"- {q} x ${p} = ${c}\n" for (_, p), q, c in zip(items, qty, costs))
            + f"Total: ${sum(costs)}. Change: {paid} - {sum(costs)} = ${paid - sum(costs)}.")


def _m_work(r):
    a, b = r.choice([(3, 6), (4, 12), (6, 12), (10, 15), (12, 24), (5, 20)])
    t = a * b / (a + b)
    return (f"One pipe fills a tank in {a} hours and a second pipe fills it in {b} hours. How long do they take "
            f"together?\n"
            f"Per hour the first fills 1/{a} of the tank and the second fills 1/{b}. Together they fill "
            f"1/{a} + 1/{b} = {a + b}/{a * b} of the tank per hour, so the time is {a * b}/{a + b} = {t:g} hours.")


def _m_sequence(r):
    a, d, k = r.randint(1, 9), r.randint(2, 7), r.randint(8, 20)
    last = a + (k - 1) * d
    return (f"The sequence {a}, {a + d}, {a + 2 * d}, {a + 3 * d}, ... goes up by the same amount each time. "
            f"What is term number {k}, and what is the sum of the first {k} terms?\n"
            f"The common difference is {d}. Term {k} is {a} + ({k} - 1) x {d} = {last}.\n"
            f"The sum of an arithmetic sequence is the number of terms times the average of the first and last "
            f"term: {k} x ({a} + {last}) / 2 = {k * (a + last) // 2}.")


def _m_probability(r):
    red, blue, green = r.randint(2, 9), r.randint(2, 9), r.randint(1, 6)
    from fractions import Fraction
    p = Fraction(red, red + blue + green)
    return (f"A bag holds {red} red, {blue} blue and {green} green marble{'s' if green > 1 else ''}. One marble is drawn at random. "
            f"What is the probability that it is red?\n"
            f"There are {red + blue + green} marbles in total and {red} of them are red, so the probability is "
            f"{red}/{red + blue + green}" + (f", which simplifies to {p}." if p.denominator != red + blue + green else ".")
            + f" As a decimal that is about {float(p):.3f}.")


def _m_time(r):
    h, m = r.randint(6, 20), r.choice([0, 10, 15, 25, 30, 45, 50])
    dur = r.choice([35, 50, 75, 95, 130, 165])
    end = h * 60 + m + dur
    return (f"A film starts at {h:02d}:{m:02d} and lasts {dur} minutes. When does it end?\n"
            f"{dur} minutes is {dur // 60} hour{'s' if dur // 60 != 1 else ''} and {dur % 60} minutes. "
            f"Adding this to {h:02d}:{m:02d} gives {end // 60 % 24:02d}:{end % 60:02d}.")


def _m_units(r):
    km = r.choice([3, 5, 8, 10, 21.1, 42.2])
    return (f"How many metres are in {km:g} kilometres, and roughly how many miles is that?\n"
            f"One kilometre is 1000 metres, so {km:g} km = {km * 1000:g} m. One mile is about 1.609 km, so the "
            f"distance is about {km / 1.609:.2f} miles.")


def _m_pythagoras(r):
    a, b, c = r.choice([(3, 4, 5), (5, 12, 13), (8, 15, 17), (6, 8, 10), (7, 24, 25), (9, 12, 15)])
    return (f"A ladder leans against a wall. Its foot is {a} m from the wall and it reaches {b} m up the wall. "
            f"How long is the ladder?\n"
            f"The wall, the ground and the ladder form a right triangle, so by Pythagoras' theorem the length is "
            f"sqrt({a}^2 + {b}^2) = sqrt({a * a} + {b * b}) = sqrt({c * c}) = {c} m.")


# Handwritten reasoning passages (no template numbers): short explanations and proofs.
MATH_NOTES = _source("math_notes")

MATH_TEMPLATES = [_m_apples, _m_speed, _m_percent, _m_rectangle, _m_average, _m_linear, _m_recipe, _m_ages,
                  _m_fraction, _m_shop, _m_work, _m_sequence, _m_probability, _m_time, _m_units, _m_pythagoras]

def _m_savings(r):
    n, weekly, weeks, goal = r.choice(NAMES), r.choice([5, 8, 10, 12, 15, 20]), r.randint(4, 16), r.choice([150, 200, 250, 300])
    saved = weekly * weeks
    left = max(goal - saved, 0)
    more = -(-left // weekly)
    return (f"{n} saves ${weekly} every week. After {weeks} weeks, how much has {n} saved, and how many more "
            f"weeks are needed to reach ${goal}?\n"
            f"Saved so far: {weekly} x {weeks} = ${saved}. "
            + (f"Still missing: {goal} - {saved} = ${left}, which takes {left} / {weekly} rounded up = {more} "
               f"more week{'s' if more != 1 else ''}." if left else f"That already reaches the goal of ${goal}."))


def _m_ratio(r):
    a, b = r.choice([(2, 3), (3, 5), (1, 4), (4, 5), (3, 7)])
    k = r.randint(3, 12)
    total = (a + b) * k
    return (f"Red and white paint are mixed in the ratio {a}:{b}. How much of each is in {total} litres of the mix?\n"
            f"The ratio has {a} + {b} = {a + b} parts, so one part is {total} / {a + b} = {k} litres. "
            f"Red: {a} x {k} = {a * k} litres; white: {b} x {k} = {b * k} litres.")


def _m_interest(r):
    p, rate, years = r.choice([1000, 2000, 5000]), r.choice([2, 3, 4, 5]), r.choice([2, 3])
    bal = p
    steps = []
    for y in range(1, years + 1):
        new = round(bal * (1 + rate / 100), 2)
        steps.append(f"after year {y}: {bal:.2f} x 1.{rate:02d} = {new:.2f}")
        bal = new
    return (f"You deposit ${p} at {rate}% interest per year, compounded yearly. What is the balance after "
            f"{years} years?\n" + "\n".join(steps) + f"\nThe balance is ${bal:.2f}, so the interest earned is "
            f"${bal - p:.2f}.")


def _m_angles(r):
    a, b = r.randint(25, 80), r.randint(25, 80)
    return (f"Two angles of a triangle measure {a} degrees and {b} degrees. What is the third angle?\n"
            f"The angles of a triangle add up to 180 degrees, so the third angle is 180 - {a} - {b} = {180 - a - b} degrees.")


MATH_TEMPLATES += [_m_savings, _m_ratio, _m_interest, _m_angles]

MATH_NOTES += [
    "Dividing by a fraction is the same as multiplying by its reciprocal. To see why 6 / (1/2) = 12, ask "
    "how many halves fit into six: each whole holds two halves, so six wholes hold twelve.",
    "A number is divisible by 4 when the number formed by its last two digits is divisible by 4, because "
    "100 is a multiple of 4. For example, 7,316 ends in 16, which is 4 x 4, so 7,316 is divisible by 4.",
    "Rounding too early can cause errors. If a recipe needs 1.45 kg of flour per batch and you make "
    "twelve batches, rounding first to 1.5 kg gives 18 kg, while the exact amount is 17.4 kg. Round only "
    "at the end.",
    "The number of ways to arrange n different books on a shelf is n factorial: n choices for the first "
    "place, n - 1 for the second, and so on. Five books can be arranged in 5 x 4 x 3 x 2 x 1 = 120 ways.",
]
# ----------------------------------------------------------------------------------------------------
# Multilingual: handwritten paragraphs in eight languages (everyday topics). A sample is one or more
# paragraphs of the same language.
# ----------------------------------------------------------------------------------------------------
MULTI = _source("multi")

MULTI["fr"] += [
    "Le dimanche, mon père prépare toujours le même repas : un poulet rôti avec des pommes de terre et une "
    "salade verte. Nous nous plaignons parfois de ce manque de variété, mais en réalité, personne ne "
    "voudrait changer cette tradition.",
    "La ville a transformé une ancienne voie ferrée en promenade plantée d'arbres. Les habitants y courent, "
    "y promènent leurs chiens et s'y retrouvent le soir. Les commerçants du quartier disent que leurs "
    "affaires ont bien augmenté depuis son ouverture.",
]
MULTI["de"] += [
    "Meine Großmutter schreibt noch immer Briefe mit der Hand. Sie sagt, eine E-Mail sei schnell vergessen, "
    "aber einen Brief hebe man auf. In ihrer Schublade liegen Hunderte von Briefen aus fünfzig Jahren.",
    "Viele Städte bauen neue Radwege, damit mehr Menschen mit dem Fahrrad zur Arbeit fahren. In "
    "Kopenhagen und Amsterdam ist das längst normal. Bei uns streiten die Leute noch darüber, ob dafür "
    "Parkplätze wegfallen dürfen.",
]
MULTI["es"] += [
    "En mi ciudad hay un mercado cubierto donde compro la fruta cada semana. La señora del puesto de la "
    "esquina ya sabe lo que me gusta y siempre me guarda las mejores naranjas. A cambio, yo le cuento cómo "
    "van mis estudios.",
    "Muchos jóvenes comparten piso para ahorrar en el alquiler. Convivir con desconocidos no siempre es "
    "fácil: hay que ponerse de acuerdo sobre la limpieza, el ruido y la comida de la nevera. Con el tiempo, "
    "algunos compañeros se convierten en buenos amigos.",
]
MULTI["it"] += [
    "Il treno regionale era pieno di studenti che tornavano a casa per il fine settimana. Qualcuno "
    "dormiva, qualcuno ripassava per un esame, e due ragazzi suonavano piano la chitarra in fondo al "
    "vagone. Il viaggio è sembrato più corto del solito.",
    "Mio zio ha aperto una piccola libreria in centro. Oltre ai libri, organizza letture per bambini il "
    "sabato mattina e presentazioni di autori locali. Dice che non diventerà mai ricco, ma che non "
    "cambierebbe lavoro per nulla al mondo.",
]
MULTI["pt"] += [
    "O meu vizinho cria abelhas no quintal. No verão, ele oferece frascos de mel a todos os moradores da "
    "rua e explica às crianças como as abelhas trabalham. Graças a ele, as flores do bairro estão mais "
    "bonitas do que nunca.",
    "Aprender a nadar depois dos trinta anos foi um desafio. Nas primeiras aulas eu tinha medo de pôr a "
    "cabeça debaixo de água, mas o professor foi muito paciente. Hoje nado duas vezes por semana e sinto "
    "que ganhei uma nova liberdade.",
]
MULTI["zh"] += [
    "我的爷爷每天早上都去茶馆喝茶。他在那里和老朋友下棋、聊天，一坐就是一个上午。"
    "他说，茶馆里的消息比报纸上的还多。",
    "这个城市的地铁又快又方便，但是上下班的时候人特别多。很多人在车上看手机、听音乐，"
    "也有人闭着眼睛休息。周末的时候，车厢里就安静多了。",
]
MULTI["ja"] += [
    "祖母は毎年、梅の実で梅干しを作ります。塩に漬けてから、夏の晴れた日に三日間ほど外で干します。"
    "家族みんなで手伝うので、それが夏の楽しみの一つになっています。",
    "新しい仕事を始めてから三か月が経ちました。最初は分からないことばかりでしたが、先輩がていねいに"
    "教えてくれたので、少しずつ自信がついてきました。来月は初めて一人でお客さんに会います。",
]
MULTI["ru"] += [
    "Мой сосед по вечерам играет на скрипке. Сначала это немного мешало, но теперь я жду его музыку и "
    "даже расстраиваюсь, когда он уезжает. Недавно он пригласил весь подъезд на свой концерт.",
    "Осенью мы всей семьёй ходим в лес за грибами. Папа знает самые хорошие места и встаёт раньше всех. "
    "Вечером мы чистим грибы на кухне, а на следующий день бабушка варит из них суп.",
]
# ----------------------------------------------------------------------------------------------------
# Structured: records drawn from handwritten field vocabularies, rendered as JSON, JSON Lines, CSV,
# Markdown tables, YAML and log lines. Calibration and evaluation use different schemas.
# ----------------------------------------------------------------------------------------------------
FIRST = ["Alice", "Bruno", "Carmen", "Deepak", "Eva", "Felix", "Gita", "Hamid", "Iris", "Jun", "Kalani",
         "Liam", "Maya", "Noor", "Olga", "Pedro", "Rania", "Sven", "Tomas", "Yuki", "Zara"]
LAST = ["Andersen", "Brooks", "Costa", "Dubois", "Eriksen", "Fischer", "Garcia", "Haas", "Ito", "Jensen",
        "Kowalski", "Lopez", "Moreau", "Nakamura", "Okafor", "Petrov", "Quinn", "Rossi", "Silva", "Tanaka"]
CITIES = ["Lisbon", "Oslo", "Nairobi", "Toronto", "Osaka", "Lyon", "Krakow", "Austin", "Seville", "Dublin",
          "Porto", "Leeds", "Hanoi", "Quito", "Perth", "Bergen", "Turin", "Accra", "Denver", "Malmo"]


def _person(r):
    return f"{r.choice(FIRST)} {r.choice(LAST)}"


def _date(r, year=2024):
    return f"{year}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"


def _employee(r):
    return {"employee_id": f"E{r.randint(1000, 9999)}", "name": _person(r),
            "department": r.choice(["Sales", "Engineering", "Finance", "Support", "Marketing", "Legal"]),
            "office": r.choice(CITIES), "start_date": _date(r, r.randint(2012, 2024)),
            "salary": r.randrange(38000, 140000, 500), "remote": r.choice([True, False])}


def _product(r):
    kind = r.choice(["desk lamp", "water bottle", "backpack", "keyboard", "kettle", "yoga mat", "headphones",
                     "notebook", "umbrella", "coffee grinder", "bike light", "phone stand"])
    return {"sku": f"{kind[:3].upper()}-{r.randint(100, 999)}", "name": f"{r.choice(['Basic', 'Pro', 'Eco', 'Mini', 'Classic'])} {kind}",
            "price": round(r.uniform(4, 180), 2), "currency": r.choice(["EUR", "USD", "GBP"]),
            "in_stock": r.randint(0, 250), "tags": r.sample(["sale", "new", "gift", "outdoor", "office", "kitchen"], 2)}


def _order(r):
    n = r.randint(1, 3)
    items = [{"sku": f"SKU{r.randint(10, 99)}", "qty": r.randint(1, 4), "unit_price": round(r.uniform(3, 60), 2)}
             for _ in range(n)]
    return {"order_id": r.randint(100000, 999999), "customer": _person(r), "placed": _date(r),
            "status": r.choice(["pending", "shipped", "delivered", "cancelled", "returned"]),
            "items": items, "total": round(sum(i["qty"] * i["unit_price"] for i in items), 2),
            "ship_to": {"city": r.choice(CITIES), "postcode": str(r.randint(10000, 99999))}}


def _weather(r):
    return {"station": r.choice(CITIES), "date": _date(r), "temp_min_c": r.randint(-12, 18),
            "temp_max_c": r.randint(19, 38), "rain_mm": round(r.uniform(0, 30), 1),
            "wind_kmh": r.randint(0, 70), "sky": r.choice(["clear", "cloudy", "overcast", "showers", "fog", "snow"])}


def _book(r):
    return {"title": r.choice(["The Quiet Harbour", "Notes on Glass", "A River in Winter", "Small Machines",
                               "The Salt Road", "Letters to a Gardener", "North of Midnight", "The Paper Orchard"]),
            "author": _person(r), "year": r.randint(1950, 2024), "pages": r.randint(120, 720),
            "genre": r.choice(["mystery", "history", "poetry", "science", "travel", "fantasy"]),
            "rating": round(r.uniform(2.5, 5.0), 1)}


def _flight(r):
    a, b = r.sample(["LIS", "OSL", "NBO", "YYZ", "KIX", "LYS", "KRK", "AUS", "SVQ", "DUB", "OPO", "HAN"], 2)
    return {"flight": f"{r.choice(['TP', 'SK', 'KQ', 'AC', 'JL', 'FR'])}{r.randint(100, 2999)}", "from": a, "to": b,
            "departs": f"{r.randint(0, 23):02d}:{r.choice(['05', '20', '35', '50'])}", "gate": f"{r.choice('ABCD')}{r.randint(1, 40)}",
            "seats_free": r.randint(0, 60), "delayed": r.random() < 0.3}


def _lab(r):
    return {"sample": f"S-{r.randint(1, 500):04d}", "assay": r.choice(["pH", "turbidity", "nitrate", "lead", "coliform"]),
            "value": round(r.uniform(0.01, 9.9), 3), "unit": r.choice(["mg/L", "NTU", "pH", "CFU/100mL"]),
            "technician": r.choice(FIRST), "passed_qc": r.random() < 0.85}


def _movie(r):
    return {"film": r.choice(["Blue Lanterns", "The Last Ferry", "Copper Sky", "Midnight Orchard Run",
                              "Seven Quiet Rooms", "Paper Tigers Dance"]),
            "director": _person(r), "released": r.randint(1972, 2024), "minutes": r.randint(84, 171),
            "box_office_musd": round(r.uniform(0.5, 410), 1), "language": r.choice(["en", "fr", "ja", "es", "ko"])}


def _booking(r):
    return {"booking_ref": "".join(r.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(6)),
            "guest": _person(r), "hotel": f"Hotel {r.choice(['Aurora', 'Mirador', 'Lindenhof', 'Sakura', 'Bellavista'])}",
            "check_in": _date(r, 2025), "nights": r.randint(1, 9), "room": r.choice(["single", "double", "suite", "twin"]),
            "breakfast": r.choice([True, False])}


CAL_SCHEMAS = {"employees": _employee, "products": _product, "orders": _order, "weather": _weather, "books": _book}
EVAL_SCHEMAS = {"flights": _flight, "lab_results": _lab, "films": _movie, "bookings": _booking}


def _flat(rec):
    """Flatten nested values for tabular formats (CSV, Markdown, log lines)."""
    out = {}
    for k, v in rec.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        elif isinstance(v, list):
            out[k] = ";".join(x if isinstance(x, str) else json.dumps(x, separators=(",", ":")) for x in v)
        else:
            out[k] = v
    return out


def _fmt_value(v):
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def render_records(r, name, records, fmt):
    """Render records in one of the structured formats, with a short natural caption."""
    if fmt == "json":
        body = json.dumps(records, indent=2, ensure_ascii=False)
        return f"{name}.json\n{body}"
    if fmt == "jsonl":
        return "\n".join(json.dumps(x, ensure_ascii=False) for x in records)
    flat = [_flat(x) for x in records]
    cols = list(flat[0])
    if fmt == "csv":
        lines = [",".join(cols)] + [",".join(_csv_cell(_fmt_value(x[c])) for c in cols) for x in flat]
        return f"# {name}.csv\n" + "\n".join(lines)
    if fmt == "markdown":
        head = "| " + " | ".join(cols) + " |\n|" + "|".join("---" for _ in cols) + "|\n"
        rows = "\n".join("| " + " | ".join(_fmt_value(x[c]) for c in cols) + " |" for x in flat)
        return f"Table: {name.replace('_', ' ')}\n\n{head}{rows}"
    if fmt == "yaml":
        out = [f"{name}:"]
        for x in flat:
            first = True
            for c in cols:
                out.append(("  - " if first else "    ") + f"{c}: {_fmt_value(x[c])}")
                first = False
        return "\n".join(out)
    if fmt == "log":
        return "\n".join(f"{_date(r)}T{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}Z "
                         f"{r.choice(['INFO', 'INFO', 'INFO', 'WARN', 'DEBUG'])} {name} "
                         + " ".join(f"{c}={_fmt_value(x[c])}" for c in cols) for x in flat)
    raise ValueError(f"unknown structured format {fmt!r}")


def _csv_cell(s):
    # RFC 4180 quoting: wrap cells holding a comma or quote, double the inner quotes.
    return '"' + s.replace('"', '""') + '"' if ("," in s or '"' in s) else s


STRUCT_FORMATS = ["json", "jsonl", "csv", "markdown", "yaml", "log"]

# ----------------------------------------------------------------------------------------------------
# Eval tasks with checkable answers. Facts below were written and checked by hand.
# ----------------------------------------------------------------------------------------------------
# (question, answer, answer-form instruction)
FACTUAL = _source("factual")

# (question, [correct, wrong, wrong, wrong]); the builder shuffles the options with the seed.
MULTIPLE_CHOICE = _source("multiple_choice")

# Material for the generated tasks (json_extraction, formatting).
TASK_WORDS = ["river", "lantern", "pencil", "garden", "window", "marble", "rocket", "violin", "castle", "meadow",
              "ticket", "basket", "orange", "planet", "forest", "silver", "kitten", "harbor", "candle", "mirror"]
TASK_PHRASES = ["good morning", "the quick brown fox", "open the door", "happy birthday", "see you soon",
                "blue sky", "fresh bread", "thank you very much", "north wind", "little red boat",
                "hello world", "paper plane", "quiet library", "green tea"]
JOBS = ["teacher", "nurse", "engineer", "baker", "pilot", "farmer", "architect", "librarian", "chef", "painter"]
PETS = ["dog", "cat", "parrot", "rabbit", "hamster", "turtle"]

# ----------------------------------------------------------------------------------------------------
# Builder
# ----------------------------------------------------------------------------------------------------
EVAL_EVERY = 4  # item i of every pool goes to evaluation when i % EVAL_EVERY == EVAL_EVERY - 1


def _split(items, part):
    """The calibration ("cal") or evaluation ("eval") share of a pool; the two never overlap."""
    if part not in ("cal", "eval"):
        raise ValueError(f"part must be 'cal' or 'eval', got {part!r}")
    keep_eval = part == "eval"
    return [x for i, x in enumerate(items) if (i % EVAL_EVERY == EVAL_EVERY - 1) == keep_eval]


class TokenCounter:
    """Counts SmolLM2 tokens (no special tokens) with the `tokenizers` library; cached per text."""

    def __init__(self, path: Path | None = None):
        from tokenizers import Tokenizer

        if path is None:
            from accel.hub import resolve_model

            path = resolve_model("smollm2-135m", pull_if_missing=True) / "tokenizer.json"

        if not path.exists():
            raise FileNotFoundError(f"tokenizer not found at {path}; the SmolLM2 folder is needed to count tokens")
        self._tok = Tokenizer.from_file(str(path))
        self._cache: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        n = self._cache.get(text)
        if n is None:
            n = len(self._tok.encode(text, add_special_tokens=False).ids)
            self._cache[text] = n
        return n


def bucket_of(n: int) -> str:
    """Label of the length bucket holding n tokens: '<=64', '65-256', '257-1024', '>1024'."""
    lo = 1
    for hi in BUCKETS:
        if n <= hi:
            return f"<={hi}" if lo == 1 else f"{lo}-{hi}"
        lo = hi + 1
    return f">{BUCKETS[-1]}"


_SENT_END = "。！？.!?"


def _sentences(text: str) -> list[str]:
    out, cur = [], ""
    for i, ch in enumerate(text):
        cur += ch
        nxt = text[i + 1] if i + 1 < len(text) else " "
        if ch in _SENT_END and (ch in "。！？" or nxt == " "):
            out.append(cur.strip())
            cur = ""
    if cur.strip():
        out.append(cur.strip())
    return out


def _joiner_for(lang: str) -> str:
    return "" if lang in ("zh", "ja") else " "


class Pool:
    """Draws items without replacement; refills (reshuffled) only when `cycle` is set."""

    def __init__(self, rng: random.Random, items, cycle=False):
        self.rng, self.items, self.cycle = rng, list(items), cycle
        self._left: list = []
        self._refill()

    def _refill(self):
        self._left = list(self.items)
        self.rng.shuffle(self._left)

    def __call__(self):
        if not self._left:
            if not self.cycle:
                return None
            self._refill()
        return self._left.pop()


def compose(count, unit_fn, lo, hi, joiner="\n\n", prefix="", max_rejects=12):
    """Join units from unit_fn until the text has lo..hi tokens; None when that fails."""
    parts, rejects = [], 0
    while True:
        unit = unit_fn()
        if unit is None:
            return None
        text = prefix + joiner.join(parts + [unit])
        n = count(text)
        if n > hi:
            rejects += 1
            if rejects > max_rejects:
                return None
            continue
        parts.append(unit)
        if n >= lo:
            return text


# --- per-domain sample makers: (rng, part, count, lo, hi) -> (text, source) or None ---------------------

# Instructions are split by part too: a shared 50-character instruction would make eval overlap calibration.
_SUMMARY_LEADS = {"cal": ["Summarize the following passage in one sentence.",
                          "Write a one-sentence summary of the text below.",
                          "Read the passage and give its main point in a single sentence."],
                  "eval": ["Sum up this text in a sentence.", "In one sentence, what is this about?"]}


def make_prose(r, part, count, lo, hi):
    items = _split(PROSE, part)
    if hi <= 64:
        summary, para = r.choice(items)
        sents = _sentences(para)
        k = r.randint(1, 2)
        text = r.choice([summary, " ".join(sents[:k]), " ".join(sents[-k:])])
        return (text, "handwritten") if count(text) <= hi else None
    fmt = r.choice(["paragraphs", "paragraphs", "summarize", "article"])
    pool = Pool(r, items)
    if fmt == "paragraphs":
        text = compose(count, lambda: (lambda x: x and x[1])(pool()), lo, hi)
        return text and (text, "handwritten")
    if fmt == "article":
        def unit():
            x = pool()
            return x and f"{x[0].rstrip('.')}\n\n{x[1]}"
        text = compose(count, unit, lo, hi, joiner="\n\n* * *\n\n")
        return text and (text, "handwritten")
    lead = r.choice(_SUMMARY_LEADS[part])

    def unit():
        x = pool()
        return x and f"{lead}\n\n{x[1]}\n\nSummary: {x[0]}"
    text = compose(count, unit, lo, hi, joiner="\n\n---\n\n")
    return text and (text, "template:summarize")


def make_chat(r, part, count, lo, hi):
    pairs = _split(CHAT, part)
    systems = _split(SYSTEM_LINES, part)
    pool = Pool(r, pairs)
    prefix = f"System: {r.choice(systems)}\n" if r.random() < 0.35 else ""
    text = compose(count, lambda: (lambda x: x and f"User: {x[0]}\nAssistant: {x[1]}")(pool()), lo, hi,
                   joiner="\n", prefix=prefix)
    return text and (text, "handwritten")


_FENCE_LEADS = {"cal": ["Here is the {lang} version:", "The {lang} snippet:", "For comparison, in {lang}:",
                        "A {lang} example from the same project:"],
                "eval": ["And the {lang} code:", "In {lang}:", "Next, {lang}:"]}


def make_code(r, part, count, lo, hi):
    snippets = _split(CODE, part)
    langs = sorted({lang for lang, _ in snippets})
    if hi <= 1024 and r.random() < 0.75:
        lang = r.choice(langs)
        pool = Pool(r, [s for l, s in snippets if l == lang])
        header = r.choice(CODE_HEADERS[lang]) + "\n\n" if r.random() < 0.4 and hi > 64 else ""
        text = compose(count, pool, lo, hi, joiner="\n\n\n", prefix=header)
        return text and (text, "handwritten")
    pool = Pool(r, snippets)

    def unit():
        x = pool()
        return x and f"{r.choice(_FENCE_LEADS[part]).format(lang=x[0])}\n\n```{x[0]}\n{x[1]}\n```"
    text = compose(count, unit, lo, hi, joiner="\n\n")
    return text and (text, "handwritten")


def make_math(r, part, count, lo, hi):
    templates = _split(MATH_TEMPLATES, part)
    notes = _split(MATH_NOTES, part)
    note_pool = Pool(r, notes)

    def unit():
        if r.random() < 0.2:
            note = note_pool()
            if note is not None:
                return note
        return r.choice(templates)(r).strip()
    text = compose(count, unit, lo, hi, max_rejects=30)
    return text and (text, "template:math_word_problems")


def make_structured(r, part, count, lo, hi):
    schemas = CAL_SCHEMAS if part == "cal" else EVAL_SCHEMAS
    name = r.choice(sorted(schemas))
    fmt = r.choice(STRUCT_FORMATS)
    if hi <= 64:
        rec = _flat(schemas[name](r))
        keys = r.sample(list(rec), min(len(rec), 3))
        text = json.dumps({k: rec[k] for k in keys}, ensure_ascii=False)
        return (text, "template:records") if count(text) <= hi else None
    records = []
    text = None
    for _ in range(200):
        records.append(schemas[name](r))
        cand = render_records(r, name, records, fmt)
        n = count(cand)
        if n > hi:
            break
        text = cand
        if n >= lo:
            return text, "template:records"
    return None


def make_multilingual(r, part, count, lo, hi):
    langs = sorted(MULTI)
    if hi <= 64:
        lang = r.choice(langs)
        sents = _sentences(r.choice(_split(MULTI[lang], part)))
        i = r.randrange(len(sents))
        text = _joiner_for(lang).join(sents[i:i + r.randint(1, 2)])
        return (text, "handwritten") if count(text) <= hi else None
    if r.random() < (0.7 if hi <= 256 else 0.5):
        lang = r.choice(langs)
        pool = Pool(r, _split(MULTI[lang], part))
        text = compose(count, pool, lo, hi)
        if text:
            return text, "handwritten"
    pool = Pool(r, [(lang, p) for lang in langs for p in _split(MULTI[lang], part)])
    text = compose(count, lambda: (lambda x: x and f"[{x[0]}]\n{x[1]}")(pool()), lo, hi)
    return text and (text, "handwritten")


MAKERS: dict[str, Callable] = {"chat": make_chat, "code": make_code, "math": make_math, "prose": make_prose,
                               "structured": make_structured, "multilingual": make_multilingual}


def _bucket_ranges():
    lo, out = 1, []
    for hi in BUCKETS:
        out.append((lo, hi))
        lo = hi + 1
    out.append((lo, 2 * BUCKETS[-1]))
    return out


DROPPED: dict[str, int] = {}  # eval candidates dropped by the overlap safety net, per domain (reported by main)


def build_text_set(domain, part, plan, count, seed, reject=None):
    """Samples for one domain: plan is [(lo, hi, n)], reject(text) -> True drops a candidate (disjointness)."""
    r = random.Random(f"{seed}-{domain}-{part}")
    out, seen = [], set()
    for lo, hi, n in plan:
        got, attempts = 0, 0
        while got < n:
            attempts += 1
            if attempts > 400 * n:
                raise RuntimeError(f"{domain}/{part}: could only make {got}/{n} samples with {lo}-{hi} tokens")
            # Aim at a log-uniform target inside the bucket so lengths spread over it instead of
            # bunching at its lower bound (makers stop adding pieces once they pass the target).
            target = round(math.exp(r.uniform(math.log(lo), math.log(hi)))) if hi > 64 else lo
            made = MAKERS[domain](r, part, count, target, hi)
            if made is None:
                continue
            text, source = made
            if text in seen or not (lo <= count(text) <= hi):
                continue
            if reject is not None and reject(text):
                DROPPED[domain] = DROPPED.get(domain, 0) + 1
                continue
            seen.add(text)
            out.append((text, source))
            got += 1
    r.shuffle(out)
    return out

# --- eval tasks -------------------------------------------------------------------------------------------

def _task_arithmetic(r):
    items = []
    for i in range(14):  # easy: single operation on one-digit numbers (SmolLM2-135M gets many of these)
        a, b = r.randint(1, 9), r.randint(1, 9)
        op = ["+", "+", "-", "times"][i % 4]
        if op == "-":
            a, b = max(a, b), min(a, b)
        val = a + b if op == "+" else a - b if op == "-" else a * b
        q = r.choice([f"What is {a} {op} {b}?", f"How much is {a} {op} {b}?"])
        items.append((f"{q} Answer with only the number.", str(val)))
    for _ in range(14):  # medium: two-digit numbers, division with whole results
        kind = r.choice(["add", "sub", "mul", "div"])
        if kind == "add":
            a, b = r.randint(20, 99), r.randint(20, 99)
            q, val = f"What is {a} + {b}?", a + b
        elif kind == "sub":
            a, b = r.randint(50, 199), r.randint(10, 49)
            q, val = f"What is {a} - {b}?", a - b
        elif kind == "mul":
            a, b = r.randint(11, 25), r.randint(3, 12)
            q, val = f"What is {a} times {b}?", a * b
        else:
            b, val = r.randint(2, 12), r.randint(3, 15)
            q = f"What is {b * val} divided by {b}?"
        items.append((f"{q} Answer with only the number.", str(val)))
    for _ in range(8):  # mixed operations with precedence
        a, b, c = r.randint(2, 9), r.randint(2, 9), r.randint(1, 20)
        form = r.choice(["{a} * {b} + {c}", "{c} + {a} * {b}", "({a} + {b}) * {c}", "{a} * ({c} - {b})"])
        expr = form.format(a=a, b=b, c=c)
        val = eval(expr)  # our own expression string: digits, + - * and brackets only
        items.append((f"Evaluate {expr}. Answer with only the number.", str(val)))
    names = r.sample(["Lucia", "Tom", "Aiko", "Marcus", "Fatima", "Ivan", "Chen", "Sofia", "Kwame", "Hannah"], 10)
    stories = [
        lambda n, a, b: (f"{n} has {a} stickers and gets {b} more. How many stickers does {n} have?", a + b),
        lambda n, a, b: (f"A box holds {a} pencils. {n} takes out {min(a - 1, b)}. How many pencils are left in the box?", a - min(a - 1, b)),
        lambda n, a, b: (f"{n} reads {b % 9 + 2} pages every day for {a % 6 + 3} days. How many pages is that in total?", (b % 9 + 2) * (a % 6 + 3)),
        lambda n, a, b: (f"Tickets cost {b % 7 + 3} euros each. {n} buys {a % 5 + 2} tickets. How many euros does {n} pay?", (b % 7 + 3) * (a % 5 + 2)),
        lambda n, a, b: (f"{n} shares {(a % 5 + 2) * 4} sweets equally among 4 friends. How many sweets does each friend get?", a % 5 + 2),
    ]
    for i, n in enumerate(names):
        q, val = stories[i % len(stories)](n, r.randint(10, 40), r.randint(3, 30))
        items.append((f"{q} Answer with only the number.", str(val)))
    return [{"prompt": p, "answer": a, "match": "number"} for p, a in items]


def _task_json_extraction(r):
    items = []
    people = [(f"{r.choice(FIRST)} {r.choice(LAST)}", r.randint(19, 78), r.choice(CITIES), r.choice(JOBS))
              for _ in range(60)]
    forms = [
        ("{name} is {age} years old and lives in {city}.", ["name", "age", "city"]),
        ("Meet {name}, {a_job} from {city}.", ["name", "job", "city"]),
        ("Last year {name} moved to {city}, where the {age}-year-old now works as {a_job}.", ["name", "age", "city", "job"]),
        ("Our new {job}, {name}, is {age}.", ["name", "job", "age"]),
        ("{name} ({age}) works as {a_job}.", ["name", "age", "job"]),
    ]
    for i, (name, age, city, job) in enumerate(people[:30]):
        form, keys = forms[i % len(forms)]
        a_job = ("an " if job[0] in "aeiou" else "a ") + job
        text = form.format(name=name, age=age, city=city, job=job, a_job=a_job)
        gold = {k: {"name": name, "age": age, "city": city, "job": job}[k] for k in keys}
        spec = ", ".join(f'"{k}" ({"number" if k == "age" else "string"})' for k in keys)
        items.append((f"Extract the information from the text below into a JSON object with the keys {spec}. "
                      f"Reply with only the JSON object.\nText: {text}", gold))
    products = ["umbrella", "teapot", "backpack", "lamp", "scarf", "notebook", "kettle", "mug", "helmet", "radio"]
    for i in range(12):
        item, qty, price = r.choice(products), r.randint(1, 9), r.randint(2, 90)
        text = r.choice([f"I would like to order {qty} of the {item}s at {price} dollars each.",
                         f"Order: {item}, quantity {qty}, unit price {price} dollars.",
                         f"Please send {qty} {item}s; the listed price is {price} dollars per piece."])
        gold = {"item": item, "quantity": qty, "price": price}
        items.append(("Read the order below and return a JSON object with the keys \"item\" (string, singular), "
                      "\"quantity\" (number) and \"price\" (number, per piece). Reply with only the JSON object.\n"
                      f"Order: {text}", gold))
    for i in range(8):
        name, pet, pname = r.choice(FIRST), r.choice(PETS), r.choice(["Max", "Luna", "Pip", "Coco", "Rex", "Mochi", "Olive"])
        text = f"{name} has a {pet} called {pname}."
        items.append((f"Return a JSON object with the keys \"owner\", \"animal\" and \"pet_name\" for this sentence. "
                      f"Reply with only the JSON object.\nSentence: {text}", {"owner": name, "animal": pet, "pet_name": pname}))
    return [{"prompt": p, "answer": json.dumps(g, ensure_ascii=False), "match": "json"} for p, g in items]


def _task_multiple_choice(r):
    out = []
    for q, opts in MULTIPLE_CHOICE:
        order = list(range(4))
        r.shuffle(order)
        choices = [opts[i] for i in order]
        letter = "ABCD"[order.index(0)]
        body = "\n".join(f"{l}. {c}" for l, c in zip("ABCD", choices))
        out.append({"prompt": f"{q}\n{body}\nAnswer with only the letter (A, B, C or D).", "answer": letter,
                    "choices": choices, "match": "choice"})
    return out


def _task_formatting(r):
    items = []
    words, phrases = TASK_WORDS, TASK_PHRASES
    for w in r.sample(words, 10):
        items.append((f"Repeat this word exactly: {w}\nReply with only the word.", w))
    for p in r.sample(phrases, 8):
        items.append((f"Copy the following text exactly: {p}\nReply with only the copied text.", p))
    for _ in range(8):
        ws = r.sample(words, 3)
        items.append((f"Write these words in reverse order, separated by single spaces: {' '.join(ws)}\n"
                      f"Reply with only the words.", " ".join(reversed(ws))))
    for _ in range(8):
        ws = r.sample(words, 4)
        items.append((f"Sort these words alphabetically and separate them with commas and spaces: {', '.join(ws)}\n"
                      f"Reply with only the sorted list.", ", ".join(sorted(ws))))
    for p in r.sample(phrases, 6):
        items.append((f"Replace every space in this text with a hyphen: {p}\nReply with only the result.",
                      p.replace(" ", "-")))
    for _ in range(6):
        ws = r.sample(words, r.randint(3, 5))
        items.append((f"What is the first word in this list? {' '.join(ws)}\nReply with only that word.", ws[0]))
    for _ in range(4):
        ws = r.sample(words, 3)
        items.append((f"What is the last word in this list? {' '.join(ws)}\nReply with only that word.", ws[-1]))
    return [{"prompt": p, "answer": a, "match": "exact"} for p, a in items]


def _task_factual(r):
    out = []
    for q, a, how in FACTUAL:
        out.append({"prompt": f"{q} {how}", "answer": a, "match": "number" if a.isdigit() else "exact"})
    return out


TASK_MAKERS = {"arithmetic": _task_arithmetic, "json_extraction": _task_json_extraction,
               "multiple_choice": _task_multiple_choice, "formatting": _task_formatting, "factual": _task_factual}


def build_tasks(seed, reject):
    out = {}
    for task in TASKS:
        r = random.Random(f"{seed}-task-{task}")
        rows, seen = [], set()
        for item in TASK_MAKERS[task](r):
            if item["prompt"] in seen:
                continue
            if reject(item["prompt"] + "\n" + item["answer"]):
                DROPPED[task] = DROPPED.get(task, 0) + 1
                continue
            seen.add(item["prompt"])
            rows.append(item)
        out[task] = [{"id": f"{task}-{i:04d}", "task": task, **row} for i, row in enumerate(rows, 1)]
    return out


# --- output -------------------------------------------------------------------------------------------------

def build_all(seed=SEED):
    """All files as {relative path: content}; nothing is written."""
    sys.path.insert(0, str(ROOT))
    from accel.calibration.overlap import OverlapIndex

    count = TokenCounter()
    files, cal_texts, rows_by_path = {}, [], {}
    cal_plan = [(lo, hi, n) for (lo, hi), n in zip(_bucket_ranges(), CAL_PLAN)]
    for d in DOMAINS:
        samples = build_text_set(d, "cal", cal_plan, count, seed)
        rows = [{"id": f"{d}-{i:04d}", "domain": d, "text": t, "source": s} for i, (t, s) in enumerate(samples, 1)]
        rows_by_path[f"calibration_data/{d}.jsonl"] = rows
        cal_texts += [t for t, _ in samples]
    index = OverlapIndex(cal_texts)

    def reject(text):
        return index.first_overlap(text) is not None

    for d in DOMAINS:
        samples = build_text_set(d, "eval", EVAL_PLAN, count, seed, reject=reject)
        rows_by_path[f"eval/text/{d}.jsonl"] = [
            {"id": f"eval-{d}-{i:04d}", "domain": d, "text": t, "source": s} for i, (t, s) in enumerate(samples, 1)]
    for task, rows in build_tasks(seed, reject).items():
        rows_by_path[f"eval/tasks/{task}.jsonl"] = rows
    for path, rows in rows_by_path.items():
        files[path] = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return files, rows_by_path, count


def count_table(rows_by_path, count, key="domain"):
    """Markdown table: rows = files' domain (or task), columns = length buckets, cells = sample counts."""
    labels = [bucket_of(hi) for hi in BUCKETS] + [bucket_of(BUCKETS[-1] + 1)]
    table = {}
    for rows in rows_by_path.values():
        for row in rows:
            n = count(row["text"] if "text" in row else row["prompt"])
            table.setdefault(row[key], dict.fromkeys(labels, 0))[bucket_of(n)] += 1
    lines = [f"| {key} | " + " | ".join(labels) + " | total |", "|---" * (len(labels) + 2) + "|"]
    for name, cells in table.items():
        lines.append(f"| {name} | " + " | ".join(str(cells[l]) for l in labels) + f" | {sum(cells.values())} |")
    totals = [sum(c[l] for c in table.values()) for l in labels]
    lines.append("| **all** | " + " | ".join(map(str, totals)) + f" | {sum(totals)} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="rebuild in memory and fail if the files differ")
    ap.add_argument("--table", action="store_true", help="print counts per domain/task x length bucket")
    args = ap.parse_args(argv)
    files, rows_by_path, count = build_all()
    print(f"eval candidates dropped by the overlap check: {DROPPED or 'none'}")
    if args.table:
        cal = {p: r for p, r in rows_by_path.items() if p.startswith("calibration_data/")}
        ev = {p: r for p, r in rows_by_path.items() if p.startswith("eval/text/")}
        tasks = {p: r for p, r in rows_by_path.items() if p.startswith("eval/tasks/")}
        print("calibration_data/ (tokens: SmolLM2 tokenizer, no special tokens)\n" + count_table(cal, count))
        print("\neval/text/\n" + count_table(ev, count))
        print("\neval/tasks/ (prompt tokens)\n" + count_table(tasks, count, key="task"))
        return 0
    if args.check:
        bad = [p for p, c in files.items() if not (ROOT / p).exists() or (ROOT / p).read_text(encoding="utf-8") != c]
        if bad:
            print("differs from a fresh build: " + ", ".join(bad))
            return 1
        print(f"all {len(files)} files match a fresh build")
        return 0
    for p, c in files.items():
        (ROOT / p).parent.mkdir(parents=True, exist_ok=True)
        (ROOT / p).write_text(c, encoding="utf-8")
    print(f"wrote {len(files)} files, {sum(len(c.encode()) for c in files.values()) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
