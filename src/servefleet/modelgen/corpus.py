"""A deterministic text corpus to train the tiny model's tokenizer on, generated here.

Nothing is downloaded and nothing depends on the machine: the same call gives the same bytes on
every Python version (the standard library's own sources, another local option, differ between
versions and would change the tokenizer). The text mixes common English words, a large inventory
of pronounceable made-up words with a Zipf-like frequency (so byte-pair merges keep finding new
pairs up to a 32k vocabulary), numbers, punctuation, and a little code, so the merges resemble
those of a real tokenizer and any prompt still encodes (byte-level fallback covers the rest).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from itertools import accumulate

__all__ = ["corpus_lines", "COMMON_WORDS"]

COMMON_WORDS: tuple[str, ...] = tuple(
    """
    the of and to in is was that for it as with be on not he by are this at from his but they or
    which one you had have an were there all we their been has when who will more no if out so
    what up its about into than them can only other time new some could these two may first then
    do any like my now over such our man me even most made after also did many before must
    through back years where much your way well down should because each just those people how
    too little state good very make world still see own men work long get here between both life
    being under never day same another know while last might us great old year off come since
    against go came right used take three model server token request memory cache batch queue
    engine launch ready failed load weight shard prompt answer output input start stop wait
    check health port host process group signal file folder path line error warning value number
    text word sentence story question reason simple small large fast slow early late open close
    write read send receive count measure plan job run test build data system user time
    """.split()
)

_ONSETS = (
    "",
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "w",
    "z",
    "br",
    "ch",
    "cl",
    "dr",
    "fl",
    "gr",
    "pl",
    "pr",
    "sh",
    "st",
    "th",
    "tr",
    "qu",
    "sp",
)
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "io", "ou", "oo", "y")
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck", "rt", "x")
_PUNCT = (".", ".", ".", ",", ",", "!", "?", ";", ":")
_CODE_TEMPLATES = (
    "def {a}_{b}({c}, {d}=None):",
    "    return {c} + {d} * {n}",
    "for {c} in range({n}):",
    "    {a}[{c}] = {b}.get({c}, {n})",
    "if {a} is not None and {b} > {n}:",
    "class {A}{B}:",
    '    """{A} {b} {c}."""',
    '{a} = {{"{b}": {n}, "{c}": [{n}, {m}]}}',
    'print(f"{{{a}}} {b} {n}")',
)


def _made_up_words(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct pronounceable words of one to three syllables."""
    seen: set[str] = set(COMMON_WORDS)
    words: list[str] = []
    while len(words) < count:
        syllables = rng.choice((1, 2, 2, 2, 3))
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))
        if len(word) >= 2 and word not in seen:
            seen.add(word)
            words.append(word)
    return words


def corpus_lines(vocab_size: int, seed: int = 1234) -> Iterator[str]:
    """Lines of generated text, enough for a byte-pair tokenizer of ``vocab_size`` entries.

    ``seed`` is fixed by default on purpose: the tokenizer depends only on the vocabulary size,
    not on the weights' seed, so two models of one size share one tokenizer.
    """
    rng = random.Random(seed)
    inventory = list(COMMON_WORDS) + _made_up_words(rng, max(2000, 2 * vocab_size))
    # Zipf-like weights: rank r drawn with probability ~ 1 / (r + 2)^0.9.
    cum_weights = list(accumulate(1.0 / (rank + 2) ** 0.9 for rank in range(len(inventory))))
    total_words = max(40_000, 25 * vocab_size)
    emitted = 0
    while emitted < total_words:
        if rng.random() < 0.08:
            template = rng.choice(_CODE_TEMPLATES)
            a, b, c, d = rng.choices(inventory[:400], k=4)
            line = template.format(
                a=a, b=b, c=c, d=d, A=a.capitalize(), B=b.capitalize(), n=rng.randint(0, 999), m=rng.randint(0, 99999)
            )
            emitted += 4
        else:
            length = rng.randint(4, 18)
            words = rng.choices(inventory, cum_weights=cum_weights, k=length)
            if rng.random() < 0.15:
                words.insert(
                    rng.randrange(len(words)),
                    str(rng.choice((rng.randint(0, 100), rng.randint(1900, 2100), rng.randint(0, 10**6)))),
                )
            words[0] = words[0].capitalize()
            line = " ".join(words) + rng.choice(_PUNCT)
            emitted += len(words)
        yield line
