"""Workloads: what a benchmark sends. A workload is a list of `Request`s (an OpenAI request body and, for replayed
traffic, an arrival time), built in or read from a JSONL file.

Spec strings name a builtin with optional settings, `name` or `name:key=value,key=value`:

    fixed            a few short fixed prompts
    random           input=LEN,output=LEN  random word prompts; LEN is N, LO-HI (uniform) or normal:MEAN:SD
    shared-prefix    tenants=T,system=WORDS,questions=Q  T tenants, each its own long system prompt, short questions
    multi-turn       conversations=C,turns=K  each turn resends the history so far
    structured       JSON output under a json_schema response_format
    grounded         path=FILE,tasks=summarize+context_qa+chat  the first user turn of each line of grounded/dev.jsonl

Anything else is read as a path to a workload file: one JSON object per line, either a request body or
`{"body": {...}, "arrival_s": seconds}`. Bodies carry no `model` or `stream` of their own that survive: the runner
sets those. Prompt lengths of generated workloads are counted in words (about one token each for the common
English words used); the token counts a run reports come from the server's usage.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_GROUNDED = Path("../shared/data/grounded/dev.jsonl")


class WorkloadError(ValueError):
    """A workload spec or file that cannot be used; the message is one line fit for the user."""


@dataclass(frozen=True)
class Request:
    """One request to send: an OpenAI body (chat if it has `messages`, else completions) and, for replayed
    traffic, seconds after the start of the run at which to send it."""
    body: dict[str, Any]
    arrival_s: float | None = None

    @property
    def chat(self) -> bool:
        return "messages" in self.body


WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city community name "
         "president team minute idea kid body information back parent face others level office door health person "
         "art war history party result change morning reason research girl guy moment air teacher force "
         "education").split()

FIXED_PROMPTS = ("Describe the ocean.", "Explain how rain forms.", "Tell a story about a cat.", "Describe a city.",
                 "Explain photosynthesis.", "Write about mountains.", "Describe a forest.", "Tell me about bread.")

TOPICS = ("a bookshop", "an airline", "a bank", "a hospital", "a hardware store", "a university", "a hotel chain",
          "a train operator", "an insurer", "a phone company", "a city council", "a bakery")

QUESTIONS = ("What are your opening hours?", "How do I change my order?", "Can I get a refund?",
             "Who do I contact about a complaint?", "Do you deliver on weekends?", "How do I reset my password?",
             "Is there a student discount?", "Where is the nearest branch?")

SCHEMAS = (
    ("person", "Invent a person and describe them.",
     {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                       "city": {"type": "string"}}, "required": ["name", "age", "city"],
      "additionalProperties": False}),
    ("product", "Invent a product for a shop catalogue.",
     {"type": "object", "properties": {"title": {"type": "string"}, "price": {"type": "number"},
                                       "in_stock": {"type": "boolean"}}, "required": ["title", "price", "in_stock"],
      "additionalProperties": False}),
    ("event", "Invent a town event.",
     {"type": "object", "properties": {"event": {"type": "string"},
                                       "day": {"type": "string", "enum": ["Mon", "Tue", "Wed", "Thu", "Fri"]},
                                       "attendees": {"type": "integer"}},
      "required": ["event", "day", "attendees"], "additionalProperties": False}),
)


def _user(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def parse_length(text: str) -> Callable[[random.Random], int]:
    """'128' -> always 128; '32-256' -> uniform integer in [32, 256]; 'normal:128:32' -> rounded normal, at least 1."""
    try:
        if text.startswith("normal:"):
            mean, sd = (float(x) for x in text[len("normal:"):].split(":"))
            if sd < 0 or mean < 1:
                raise ValueError
            return lambda rng: max(1, round(rng.gauss(mean, sd)))
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-"))
            if not 1 <= lo <= hi:
                raise ValueError
            return lambda rng: rng.randint(lo, hi)
        n = int(text)
        if n < 1:
            raise ValueError
        return lambda rng: n
    except ValueError:
        raise WorkloadError(f"length {text!r} is not N, LO-HI or normal:MEAN:SD (positive)") from None


def fixed(opts: dict[str, str], rng: random.Random) -> list[Request]:
    return [Request(_user(p)) for p in FIXED_PROMPTS]


def random_lengths(opts: dict[str, str], rng: random.Random) -> list[Request]:
    """Prompts of random words with `input` words; `max_tokens` drawn from `output` (overrides --max-tokens)."""
    n_in, n_out = parse_length(opts.get("input", "32-256")), parse_length(opts.get("output", "16-128"))
    count = _int(opts, "count", 64)
    out = []
    for _ in range(count):
        words = " ".join(rng.choice(WORDS) for _ in range(n_in(rng)))
        body = _user(f"Continue this list of words: {words}")
        body["max_tokens"] = n_out(rng)
        out.append(Request(body))
    return out


def shared_prefix(opts: dict[str, str], rng: random.Random) -> list[Request]:
    """`tenants` distinct system prompts of about `system` words each, `questions` short questions per tenant,
    interleaved by tenant so that every tenant's prefix is in use at once."""
    tenants, length, questions = _int(opts, "tenants", 4), _int(opts, "system", 800), _int(opts, "questions", 8)
    systems = []
    for t in range(tenants):
        topic = TOPICS[t % len(TOPICS)]
        filler = " ".join(rng.choice(WORDS) for _ in range(length))
        systems.append(f"You are the assistant of {topic} (tenant {t}). Answer briefly and politely. "
                       f"Reference notes: {filler}")
    return [Request({"messages": [{"role": "system", "content": systems[t]},
                                  {"role": "user", "content": QUESTIONS[(q + t) % len(QUESTIONS)]}]})
            for q in range(questions) for t in range(tenants)]


def multi_turn(opts: dict[str, str], rng: random.Random) -> list[Request]:
    """`conversations` chats of `turns` user turns; turn k resends the k-1 earlier exchanges (with a fixed stand-in
    for each earlier answer, since bodies are built before anything is sent). Ordered turn by turn across
    conversations, so a conversation's earlier turn has usually finished before its next is sent."""
    convs, turns = _int(opts, "conversations", 4), _int(opts, "turns", 4)
    topics = [TOPICS[c % len(TOPICS)] for c in range(convs)]
    out = []
    for k in range(turns):
        for c in range(convs):
            messages: list[dict[str, str]] = []
            for j in range(k + 1):
                messages.append({"role": "user", "content": f"Question {j + 1} about {topics[c]}: "
                                 f"{QUESTIONS[(c + j) % len(QUESTIONS)]}"})
                if j < k:
                    messages.append({"role": "assistant", "content": f"Answer {j + 1}: it depends on {topics[c]}'s "
                                     f"{rng.choice(WORDS)} policy; please check with the {rng.choice(WORDS)} team."})
            out.append(Request({"messages": messages}))
    return out


def structured(opts: dict[str, str], rng: random.Random) -> list[Request]:
    return [Request({**_user(f"{prompt} Reply with JSON only."),
                     "response_format": {"type": "json_schema",
                                         "json_schema": {"name": name, "schema": schema, "strict": True}}})
            for name, prompt, schema in SCHEMAS]


def grounded(opts: dict[str, str], rng: random.Random) -> list[Request]:
    """The first user turn of each line of the grounded evaluation prompts (`path`, default
    ../shared/data/grounded/dev.jsonl relative to the working directory), filtered by `tasks`."""
    path = Path(opts.get("path", str(DEFAULT_GROUNDED)))
    tasks = set(opts.get("tasks", "summarize+context_qa+chat").split("+"))
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise WorkloadError(f"cannot read grounded prompts {path}: {e.strerror or e} (pass grounded:path=FILE)"
                            ) from None
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            task, first = row["task"], row["turns"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            raise WorkloadError(f"{path}:{i}: not a grounded prompt line (id, task, turns)") from None
        if task.split(":")[0] in tasks:
            out.append(Request(_user(first)))
    if not out:
        raise WorkloadError(f"{path}: no prompts of tasks {'+'.join(sorted(tasks))}")
    return out


BUILTINS: dict[str, Callable[[dict[str, str], random.Random], list[Request]]] = {
    "fixed": fixed, "random": random_lengths, "shared-prefix": shared_prefix, "multi-turn": multi_turn,
    "structured": structured, "grounded": grounded}


def _int(opts: dict[str, str], key: str, default: int) -> int:
    try:
        value = int(opts.get(key, default))
    except ValueError:
        raise WorkloadError(f"{key}={opts[key]!r} is not an integer") from None
    if value < 1:
        raise WorkloadError(f"{key} must be at least 1")
    return value


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """'shared-prefix:tenants=4,system=500' -> ('shared-prefix', {'tenants': '4', 'system': '500'})."""
    name, _, rest = spec.partition(":")
    opts: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise WorkloadError(f"workload setting {part!r} is not key=value")
        opts[key.strip()] = value.strip()
    return name, opts


def load_workload(spec: str, seed: int = 0) -> list[Request]:
    """A builtin by spec, else the workload file at that path; never empty."""
    name, opts = parse_spec(spec)
    if name in BUILTINS:
        return BUILTINS[name](opts, random.Random(seed))
    path = Path(spec)
    if not path.exists():
        raise WorkloadError(f"unknown workload {spec!r}: not a file and not one of {', '.join(BUILTINS)}")
    return read_file(path)


def read_file(path: Path) -> list[Request]:
    """Read a workload file (see the module docstring); arrival times, when given, must be given on every line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"cannot read workload file {path}: {getattr(e, 'strerror', None) or e}") from None
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise WorkloadError(f"{path}:{i}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise WorkloadError(f"{path}:{i}: not a JSON object")
        body, arrival = (obj["body"], obj.get("arrival_s")) if "body" in obj else (obj, None)
        if not isinstance(body, dict) or not ("messages" in body or "prompt" in body):
            raise WorkloadError(f"{path}:{i}: a request body needs `messages` (chat) or `prompt` (completions)")
        if arrival is not None and (not isinstance(arrival, int | float) or arrival < 0):
            raise WorkloadError(f"{path}:{i}: arrival_s must be a number of seconds >= 0")
        out.append(Request(body, None if arrival is None else float(arrival)))
    if not out:
        raise WorkloadError(f"workload file {path} has no requests")
    if len({r.arrival_s is None for r in out}) > 1:
        raise WorkloadError(f"workload file {path}: give arrival_s on every line or on none")
    return out


def write_file(path: Path, requests: list[Request]) -> None:
    """Write requests so that `read_file` gives them back unchanged."""
    with path.open("w", encoding="utf-8") as f:
        for r in requests:
            obj: dict[str, Any] = {"body": r.body}
            if r.arrival_s is not None:
                obj["arrival_s"] = r.arrival_s
            f.write(json.dumps(obj) + "\n")
