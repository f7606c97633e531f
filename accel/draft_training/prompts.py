"""Prompts for distilling and evaluating a draft: user turns of chat samples, instructions over passages.

calibration_data/ and eval/text/ hold JSONL samples {"id", "domain", "text"}; chat samples are transcripts
("System: ...\nUser: ...\nAssistant: ..."). A draft must learn what the target says in reply to prompts, so
the prompts are the conversations up to each user turn, and for other domains an instruction over a passage.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

_TURN = re.compile(r"^(System|User|Assistant):\s?", re.MULTILINE)
_INSTRUCTIONS = ("Summarize the following text in two sentences.", "Explain what this is about.",
                 "Rewrite the following more concisely.", "List the key points of this text.",
                 "What questions could a reader ask about this? Answer one of them.")


def parse_transcript(text: str) -> list[dict[str, str]]:
    """"System: a\\nUser: b\\nAssistant: c" -> [{"role": "system", "content": "a"}, ...]; [] if no roles."""
    parts = _TURN.split(text)
    messages = []
    for role, content in zip(parts[1::2], parts[2::2]):
        messages.append({"role": role.lower(), "content": content.strip()})
    return messages


def chat_prompts(text: str) -> list[list[dict[str, str]]]:
    """Every prefix of a transcript that ends with a user turn (the model's reply is what follows)."""
    messages = parse_transcript(text)
    return [messages[: i + 1] for i, m in enumerate(messages) if m["role"] == "user"]


def load_samples(folder: str | Path) -> list[dict]:
    """All {"id", "domain", "text"} samples of folder/*.jsonl, sorted by file name."""
    out = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def build_prompts(samples: list[dict], num_prompts: int, seed: int = 0,
                  max_passage_chars: int = 600) -> list[list[dict[str, str]]]:
    """Up to num_prompts chat-message lists: chat user turns first (open-ended replies), then instructions
    over passages of the other domains, each group shuffled with `seed`."""
    if num_prompts < 1:
        raise ValueError(f"num_prompts={num_prompts} is invalid; allowed: >= 1")
    rng = random.Random(seed)
    chats = [p for s in samples if s.get("domain") == "chat" for p in chat_prompts(s["text"])]
    others = [[{"role": "user", "content": f"{rng.choice(_INSTRUCTIONS)}\n\n{s['text'][:max_passage_chars]}"}]
              for s in samples if s.get("domain") != "chat"]
    rng.shuffle(chats)
    rng.shuffle(others)
    # interleave 2 chat : 1 other so a small num_prompts still sees both kinds
    out: list[list[dict[str, str]]] = []
    while len(out) < num_prompts and (chats or others):
        for group, n in ((chats, 2), (others, 1)):
            for _ in range(n):
                if group and len(out) < num_prompts:
                    out.append(group.pop())
    return out


_GROUNDED = ("Summarize the following passage.", "Extract every name, number and date from the following text, "
             "one per line.", "Rewrite the following passage in plain, simple English, keeping every detail.")


def input_grounded_prompts(samples: list[dict], num_prompts: int, domains: tuple[str, ...] = ("prose", "structured"),
                           max_passage_chars: int = 900) -> list[list[dict[str, str]]]:
    """Summarize / extract / rewrite instructions over the given passages (cycled), in sample order."""
    passages = [s["text"][:max_passage_chars] for s in samples if s.get("domain") in domains]
    return [[{"role": "user", "content": f"{_GROUNDED[i % len(_GROUNDED)]}\n\n{p}"}]
            for i, p in enumerate(passages[:num_prompts])]


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a conversation with the assistant's turn opened: the tokenizer's chat template, or for a base
    model without one (Gemma 3 270M) the turns' text one after another, as a plain prompt after BOS."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer("\n\n".join(m["content"] for m in messages) + "\n\n")["input_ids"]
