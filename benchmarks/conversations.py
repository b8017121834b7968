"""A conversation-shaped retrieval set: speakers, turns, questions answered by one turn.

Why: SciFact is documents and claims. An agent's memory is often a chat
history, stored one turn per evidence as ``speaker: text``; questions about it
("what did Priya name her cat?") are short, and the turn that answers them is
short and colloquial. A model can help documents and hurt conversations, so
the model benchmark runs on both (``embedding_models.py --conversations``).

The set is generated, deterministically from a seed, from the facts below:
each fact is one answering turn and one question worded differently from it
(the vocabulary gap a vector list is for), plus a decoy turn by the same
speaker about the same subject that does not answer. Between them go filler
turns of ordinary chat by the same four speakers, so the answering turn has to
be found among several hundred turns that share names and topics.
"""

from __future__ import annotations

import random

from beir_eval import Dataset

SPEAKERS = ("priya", "tomas", "lena", "marcus")

# (speaker, answering turn, question, decoy turn by the same speaker)
FACTS: tuple[tuple[str, str, str, str], ...] = (
    (
        "priya",
        "we adopted a grey kitten from the shelter, she's called Pixel",
        "what did Priya name her cat?",
        "the shelter downtown is always short of volunteers",
    ),
    (
        "tomas",
        "my flight to Lisbon leaves on the 14th at 6am, ugh",
        "when does Tomas travel to Portugal?",
        "Lisbon was lovely last spring, too many hills though",
    ),
    (
        "lena",
        "I can't eat anything with peanuts, I carry an epipen",
        "does Lena have a food allergy?",
        "I made peanut-free cookies for the bake sale",
    ),
    (
        "marcus",
        "I handed in my notice, starting at the robotics startup in March",
        "is Marcus changing jobs?",
        "the robotics meetup on Thursday was fun",
    ),
    (
        "priya",
        "my sister's wedding is in Jaipur in the first week of December",
        "where is the wedding Priya is going to?",
        "wedding dress shopping is exhausting",
    ),
    (
        "tomas",
        "the dentist moved my appointment to Friday at 4",
        "when is Tomas seeing his dentist?",
        "I really need a new toothbrush",
    ),
    (
        "lena",
        "I finally passed my driving test on the third attempt",
        "did Lena get her driver's licence?",
        "driving in the rain still scares me",
    ),
    (
        "marcus",
        "we're naming the baby Elias if it's a boy",
        "what name did Marcus pick for his son?",
        "the baby shower is next weekend",
    ),
    (
        "priya",
        "I switched to the night shift at the hospital, 10pm to 6am",
        "what hours is Priya working now?",
        "hospital coffee is terrible",
    ),
    (
        "tomas",
        "I sold the old Volvo and bought an electric bike instead",
        "what happened to Tomas's car?",
        "bike lanes here are a joke",
    ),
    (
        "lena",
        "my thesis defence is booked for June 3rd in room 204",
        "when does Lena defend her dissertation?",
        "my supervisor hates my chapter two",
    ),
    (
        "marcus",
        "I'm running the Berlin marathon in September, training already",
        "which race is Marcus preparing for?",
        "my knees hurt after the long run",
    ),
    (
        "priya",
        "the landlord is raising the rent by 15 percent so we're moving out",
        "why is Priya leaving her apartment?",
        "the apartment upstairs is so noisy",
    ),
    (
        "tomas",
        "I'm learning Japanese, lessons every Tuesday evening",
        "what language is Tomas studying?",
        "the ramen place closed down",
    ),
    (
        "lena",
        "I broke my wrist skiing, cast for six weeks",
        "how did Lena get injured?",
        "the ski trip was expensive",
    ),
    (
        "marcus",
        "my mum turns seventy on Saturday, we're throwing a surprise party",
        "whose birthday is Marcus celebrating?",
        "parties make me tired",
    ),
    (
        "priya",
        "I got the scholarship for the master's in Edinburgh",
        "where will Priya study for her postgraduate degree?",
        "Edinburgh is cold in winter",
    ),
    (
        "tomas",
        "I'm vegetarian since January, no more meat for me",
        "does Tomas still eat meat?",
        "January was a long month",
    ),
    (
        "lena",
        "our band plays at the Blue Door pub on the 21st",
        "where is Lena's gig?",
        "I need new guitar strings",
    ),
    (
        "marcus",
        "I lost my wallet on the tram, had to cancel all my cards",
        "why did Marcus cancel his bank cards?",
        "the tram was late again",
    ),
    (
        "priya",
        "my grandmother's recipe for dal uses tamarind and jaggery",
        "what goes into Priya's family lentil dish?",
        "I cooked for eight people yesterday",
    ),
    (
        "tomas",
        "we're getting solar panels installed on the roof next month",
        "what home improvement is Tomas planning?",
        "the roof leaked in the storm",
    ),
    (
        "lena",
        "I'm allergic to cats, so no pets for me sadly",
        "why doesn't Lena have a pet?",
        "my neighbour's cat sleeps on my car",
    ),
    (
        "marcus",
        "I passed the bar exam, officially a lawyer now",
        "what exam did Marcus pass?",
        "studying law takes forever",
    ),
    (
        "priya",
        "I'm training for a half marathon, up to 15 km now",
        "how far can Priya run?",
        "running in the heat is awful",
    ),
    (
        "tomas",
        "my daughter starts primary school in August",
        "when does Tomas's kid begin school?",
        "school supplies are so pricey",
    ),
    (
        "lena",
        "I got a job offer from the museum as an archivist",
        "what position was Lena offered?",
        "the museum cafe has good cake",
    ),
    (
        "marcus",
        "we moved the team offsite to a cabin in the Alps",
        "where is Marcus's team retreat?",
        "offsites are mostly long meetings",
    ),
    (
        "priya",
        "my laptop died, I'm using my brother's old one for now",
        "what happened to Priya's computer?",
        "my brother never answers his phone",
    ),
    (
        "tomas",
        "I quit coffee two weeks ago, headaches are finally gone",
        "has Tomas stopped drinking coffee?",
        "the new espresso machine at work is loud",
    ),
)

FILLER_OPENERS = (
    "honestly",
    "lol",
    "ok so",
    "anyway",
    "wait",
    "haha",
    "right",
    "hmm",
    "yeah",
    "oh",
)
FILLER_BODIES = (
    "did anyone watch the match last night",
    "I'm so tired today",
    "what are we doing for lunch",
    "the weather is weird this week",
    "can someone send me the photos from saturday",
    "I keep forgetting to call the bank",
    "this traffic is unbelievable",
    "we should plan a trip soon",
    "my phone battery is dying again",
    "has anyone tried the new pizza place",
    "I need a holiday",
    "the meeting ran over by an hour",
    "my cat knocked over a plant again",
    "did you see the news about the train strike",
    "I started a new book, it's slow so far",
    "who is bringing snacks on friday",
    "the gym was packed this morning",
    "I can't find my keys anywhere",
    "let's do dinner at mine next week",
    "my sister says hi",
    "the printer at work is broken again",
    "I'm cooking pasta tonight",
    "it's been raining all day",
    "I slept terribly",
    "we watched a documentary about whales",
    "my neighbour is renovating, so much noise",
    "I have three deadlines this week",
    "the kids were up early again",
    "I'm thinking of repainting the kitchen",
    "the concert tickets sold out in minutes",
)


def conversation_dataset(seed: int = 7, fillers: int = 600) -> Dataset:
    """Turns (evidence), questions and qrels: one relevant turn per question."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible sample, not a secret
    turns: list[str] = []
    answers: list[int] = []
    for speaker, answer, _question, decoy in FACTS:
        turns.append(f"{speaker}: {decoy}")
        answers.append(len(turns))
        turns.append(f"{speaker}: {answer}")
    for _ in range(fillers):
        speaker = rng.choice(SPEAKERS)
        turns.append(f"{speaker}: {rng.choice(FILLER_OPENERS)} {rng.choice(FILLER_BODIES)}")
    order = list(range(len(turns)))
    rng.shuffle(order)  # interleave answers, decoys and chat
    ids = {old: f"turn-{new:04d}" for new, old in enumerate(order)}
    corpus = sorted(((ids[i], text) for i, text in enumerate(turns)), key=lambda d: d[0])
    queries = {f"q{n:02d}": fact[2] for n, fact in enumerate(FACTS)}
    qrels = {f"q{n:02d}": {ids[answers[n]]: 1} for n in range(len(FACTS))}
    return Dataset(corpus, queries, qrels, {d: "" for d, _ in corpus})
