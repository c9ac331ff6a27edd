"""Train the tiny model's byte-level BPE tokenizer here, with `tokenizers`, on generated text.

Byte-level BPE (the byte-to-unicode alphabet of GPT-2) is what Llama 3 and Qwen2 ship, so every
engine treats it as a normal tokenizer, and llama.cpp reads it from GGUF metadata as a ``gpt2``
model. The split before BPE follows the family: ``llama`` models use the GPT-2 regex (llama.cpp
pre-tokenizer ``gpt-2``); ``qwen2`` models use Qwen2's regex (digits one by one; pre-tokenizer
``qwen2``), because transformers >= 5 loads any ``qwen2`` folder with ``Qwen2Tokenizer``, which
imposes that regex whatever tokenizer.json says — one split everywhere keeps the engines agreeing. The vocabulary is filled to exactly
the model's vocab size (reserved tokens pad it when the corpus runs out of merges), so embedding
rows and tokens agree, as GGUF requires.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from servefleet.modelgen.corpus import corpus_lines
from servefleet.modelgen.spec import BOS, CHAT_TEMPLATE, EOS, PAD, SPECIAL_TOKENS, TinyModelSpec

__all__ = ["TrainedTokenizer", "train_tokenizer", "tokenizer_config", "GGUF_PRE"]

# Qwen2's pre-tokenizer split (Qwen2Tokenizer in transformers; llama.cpp's "qwen2" pre-tokenizer).
QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# llama.cpp's name for the split each architecture uses (tokenizer.ggml.pre).
GGUF_PRE = {"llama": "gpt-2", "qwen2": "qwen2"}


@dataclass(frozen=True)
class TrainedTokenizer:
    tokenizer: Tokenizer
    vocab: list[str]  # token string per id, exactly spec.vocab_size entries
    merges: list[str]  # "a b" pairs, in merge order
    special_ids: dict[str, int]  # token -> id of every special (control) token
    add_bos: bool


def _reserved(i: int) -> str:
    return f"<|reserved_{i}|>"


def train_tokenizer(spec: TinyModelSpec) -> TrainedTokenizer:
    """A byte-level BPE tokenizer of exactly ``spec.vocab_size`` tokens. Depends only on the
    vocabulary size and architecture, never on the weights' seed."""
    tok = Tokenizer(models.BPE())
    if spec.arch == "qwen2":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(spec.vocab_size), trainer=trainer)

    # Pad to the exact size with reserved control tokens when the corpus ran out of merges.
    missing = spec.vocab_size - tok.get_vocab_size()
    if missing > 0:
        tok.add_special_tokens([_reserved(i) for i in range(missing)])

    # Llama-family tokenizers put <s> in front of every sequence; Qwen2's do not.
    add_bos = spec.arch == "llama"
    if add_bos:
        bos_id = tok.token_to_id(BOS)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)

    vocab_map = tok.get_vocab(with_added_tokens=True)
    if len(vocab_map) != spec.vocab_size:  # pragma: no cover - a tokenizers behaviour change
        raise RuntimeError(f"tokenizer has {len(vocab_map)} tokens, expected {spec.vocab_size}")
    vocab = [""] * spec.vocab_size
    for token, idx in vocab_map.items():
        vocab[idx] = token
    model_state = json.loads(tok.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model_state["merges"]]
    special_ids = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    return TrainedTokenizer(tok, vocab, merges, special_ids, add_bos)


def tokenizer_config(spec: TinyModelSpec, trained: TrainedTokenizer) -> dict[str, Any]:
    """``tokenizer_config.json``: the tokenizer class (the generic fast class for ``llama``, so
    transformers loads tokenizer.json as it is rather than rebuilding a SentencePiece-style Llama
    tokenizer; ``Qwen2Tokenizer`` for ``qwen2``, which transformers picks anyway), the special tokens
    and the chat template."""
    added = {
        str(idx): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for content, idx in sorted(trained.special_ids.items(), key=lambda kv: kv[1])
    }
    return {
        "tokenizer_class": "Qwen2Tokenizer" if spec.arch == "qwen2" else "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": trained.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": spec.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": added,
    }
