"""The demo tasks: synthetic chat tasks whose answer the prompt fixes, and their scoring (docs/evaluation.md).
Copied answers show parallel decoding; computed ones (sums, sorts) the threshold as a knob. Pure functions of
a `random.Random`; no torch, no files except the shipped JSONL."""
from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterable, Sequence

TASKS = ("copy", "reverse", "count", "lookup", "add", "subtract", "sort")
COPIED = ("copy", "reverse", "count", "lookup")      # answers are spans or rearrangements of the prompt
COMPUTED = ("add", "subtract", "sort")               # answers need carries, borrows or ranks
EVAL_FILE = "demo_tasks.jsonl"

NOUNS = (
    "rose", "crown", "sword", "king", "moon", "queen", "horse", "castle", "ring", "letter", "cup", "bell",
    "book", "candle", "cloak", "dagger", "door", "field", "flower", "garden", "gate", "glove", "gold",
    "hat", "heart", "hill", "house", "knife", "lamp", "lion", "map", "mirror", "night", "oak", "pearl",
    "pen", "river", "road", "sea", "ship", "shield", "sky", "star", "stone", "storm", "sun", "table",
    "tower", "tree", "wall", "water", "wind", "window", "wine", "wolf", "wood", "bird", "boat", "bread",
    "bridge", "chair", "cloud", "coin", "dog", "dream", "eagle", "fire", "fish", "forest", "ghost",
    "grass", "hand", "island", "key", "leaf", "mountain", "rain", "salt", "seed", "snow", "song",
    "spear", "spring", "stream", "throne", "torch", "winter", "apple", "arrow", "banner", "crow",
)
NAMES = (
    "Hamlet", "Ophelia", "Laertes", "Horatio", "Polonius", "Gertrude", "Claudius", "Romeo", "Juliet",
    "Tybalt", "Mercutio", "Benvolio", "Macbeth", "Banquo", "Duncan", "Macduff", "Othello", "Iago",
    "Desdemona", "Cassio", "Emilia", "Lear", "Cordelia", "Regan", "Goneril", "Edgar", "Edmund",
    "Kent", "Portia", "Shylock", "Antonio", "Bassanio", "Viola", "Olivia", "Orsino", "Malvolio",
    "Rosalind", "Orlando", "Celia", "Prospero", "Miranda", "Ariel", "Caliban", "Brutus", "Cassius",
    "Oberon", "Titania", "Puck", "Hermia", "Helena", "Lysander", "Beatrice", "Benedick", "Falstaff",
)
GOODS = ("ducats", "crowns", "roses", "horses", "books", "rings", "coins", "apples", "letters", "swords")
LINE_WORDS = (4, 14)
WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")


@dataclass(frozen=True, slots=True)
class TaskItem:
    task: str
    question: str
    answer: str

    def to_json(self) -> dict:
        return {"task": self.task, "question": self.question, "answer": self.answer}


def normalise(text: str) -> str:
    return " ".join(text.split())


def is_correct(answer: str, reference: str) -> bool:
    return normalise(answer) == normalise(reference)


def question_key(question: str) -> str:
    """The hash that keeps evaluation prompts out of training."""
    return hashlib.sha256(normalise(question).encode()).hexdigest()[:16]


def copy_lines(texts: Iterable[str]) -> list[str]:
    """Lines fit to copy: LINE_WORDS words, plain punctuation, no speaker tags."""
    out, seen = [], set()
    for text in texts:
        for line in text.split("\n"):
            line = " ".join(line.split())
            n = len(WORD.findall(line))
            if not LINE_WORDS[0] <= n <= LINE_WORDS[1] or line in seen:
                continue
            if not line[0].isupper() or line.isupper() or line.startswith(("ACT", "SCENE", "Enter", "Exit", "Exeunt")):
                continue
            if not re.fullmatch(r"[A-Za-z][A-Za-z ,.;:!?'\-]*", line):
                continue
            seen.add(line)
            out.append(line)
    return out


def make_copy(rng: random.Random, lines: Sequence[str]) -> TaskItem:
    line = rng.choice(lines)
    return TaskItem("copy", f"Say this line back:\n{line}", line)


def make_reverse(rng: random.Random) -> TaskItem:
    items = rng.sample(NOUNS, rng.randint(3, 7))
    return TaskItem("reverse", f"Reverse the list: {', '.join(items)}", f"Reversed: {', '.join(reversed(items))}")


def make_count(rng: random.Random) -> TaskItem:
    n = rng.randint(3, 12)
    start = rng.randint(0, 100 - n)
    nums = range(start, start + n)
    return TaskItem("count", f"Count from {start} to {start + n - 1}.", " ".join(map(str, nums)))


def make_lookup(rng: random.Random) -> TaskItem:
    names = rng.sample(NAMES, rng.randint(2, 5))
    values = [rng.randint(1, 99) for _ in names]
    goods = rng.choice(GOODS)
    facts = [f"{names[0]} has {values[0]} {goods}"] + [f"{n} has {v}" for n, v in zip(names[1:], values[1:])]
    k = rng.randrange(len(names))
    return TaskItem("lookup", f"{', '.join(facts)}. How many has {names[k]}?", f"Answer: {names[k]} has {values[k]}.")


def _operand(rng: random.Random, hi: int) -> int:
    if hi < 100 or rng.random() < 0.4:
        return rng.randint(10, min(99, hi))
    return rng.randint(100, hi)


def make_add(rng: random.Random) -> TaskItem:
    a = _operand(rng, 989)
    b = _operand(rng, 999 - a)
    return TaskItem("add", f"What is {a} + {b}?", f"Sum: {a + b}")


def make_subtract(rng: random.Random) -> TaskItem:
    a = _operand(rng, 999)
    b = _operand(rng, a)
    return TaskItem("subtract", f"What is {a} - {b}?", f"Difference: {a - b}")


def make_sort(rng: random.Random) -> TaskItem:
    nums = [rng.randint(10, 99) for _ in range(rng.randint(3, 6))]
    return TaskItem("sort", f"Sort: {' '.join(map(str, nums))}", f"Sorted: {' '.join(map(str, sorted(nums)))}")


def make(task: str, rng: random.Random, lines: Sequence[str]) -> TaskItem:
    if task == "copy":
        return make_copy(rng, lines)
    return {"reverse": make_reverse, "count": make_count, "lookup": make_lookup, "add": make_add,
            "subtract": make_subtract, "sort": make_sort}[task](rng)


def eval_set(seed: int, per_task: int, lines: Sequence[str]) -> list[TaskItem]:
    """`per_task` distinct questions per task, drawn with `seed`."""
    rng = random.Random(seed)
    out = []
    for task in TASKS:
        seen: set[str] = set()
        while len(seen) < per_task:
            item = make(task, rng, lines)
            if item.question not in seen:
                seen.add(item.question)
                out.append(item)
    return out


def eval_path() -> Path:
    return Path(str(resources.files("dllm_server") / "assets" / "eval" / EVAL_FILE))


def lm_eval_task_dir() -> Path:
    """The lm-evaluation-harness task folder (`--include_path`): group `dllm_demo`, one task per demo task."""
    return Path(str(resources.files("dllm_server") / "assets" / "eval" / "lm_eval"))


def load_eval(path: str | Path | None = None, tasks: Sequence[str] | None = None,
              per_task: int | None = None) -> list[TaskItem]:
    """The evaluation set (default: the shipped file), optionally only `tasks`, the first `per_task` of each."""
    items = [TaskItem(**json.loads(line)) for line in Path(path or eval_path()).read_text().splitlines() if line]
    if tasks is not None:
        items = [i for i in items if i.task in tasks]
    if per_task is not None:
        counts: dict[str, int] = {}
        kept = []
        for i in items:
            counts[i.task] = counts.get(i.task, 0) + 1
            if counts[i.task] <= per_task:
                kept.append(i)
        items = kept
    return items
