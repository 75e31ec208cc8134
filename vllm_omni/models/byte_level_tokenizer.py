"""Byte-level BPE vocabularies for tiny checkpoints, built locally with no download.

Qwen-family tokenizers encode text as bytes mapped to printable characters, then merge
them. A tiny checkpoint's tokenizer keeps the ids the serving code depends on (each byte's
id, the chat-template role words, the special tokens at their real ids) and fills every
other id below the vocabulary size with a filler token no encoding reaches (" t<id>"), so
every id a random model emits still decodes, and reads as a word in transcripts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")

# The real Qwen ids of the chat template's role words.
QWEN_ROLE_WORD_IDS = {"system": 8948, "user": 872, "assistant": 77091}


def byte_level_alphabet() -> list[str]:
    """GPT-2 / Qwen byte-to-unicode alphabet, in token-id order ('\\n' is id 198, ' ' is 220)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    remapped = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + i) for i in range(len(remapped))]


def _role_word_merges(vocab: dict[str, int], role_word_ids: Mapping[str, int]) -> list[tuple[str, str]]:
    """Merges that spell each role word left to right; intermediate pieces get free ids."""
    reserved = set(role_word_ids.values())
    next_free = len(vocab)
    merges: list[tuple[str, str]] = []
    for word, word_id in role_word_ids.items():
        piece = word[0]
        for char in word[1:]:
            merges.append((piece, char))
            piece += char
            if piece in vocab:
                continue
            if piece == word:
                vocab[piece] = word_id
            else:
                while next_free in reserved:
                    next_free += 1
                vocab[piece] = next_free
                next_free += 1
    return merges


def byte_level_vocab(vocab_size: int, special_tokens: Mapping[int, str],
                     role_word_ids: Mapping[str, int] = QWEN_ROLE_WORD_IDS) -> tuple[dict[str, int],
                                                                                   list[tuple[str, str]]]:
    """(vocab, merges) of `vocab_size` ids: bytes, role words, `special_tokens` (id → token) at
    their ids, and fillers everywhere else."""
    vocab = {char: i for i, char in enumerate(byte_level_alphabet())}
    merges = _role_word_merges(vocab, role_word_ids)
    used = set(vocab.values())
    for token_id in range(vocab_size):
        if token_id in special_tokens:
            vocab[special_tokens[token_id]] = token_id
        elif token_id not in used:
            vocab[f"\u0120t{token_id}"] = token_id
    return vocab, merges


def byte_level_tokenizer(tokenizer_class: type[T], vocab_size: int, special_tokens: Mapping[int, str],
                         chat_template: str, **kwargs: Any) -> T:
    """A `tokenizer_class` (a Qwen2Tokenizer) over `byte_level_vocab`, with `special_tokens`
    marked special and `chat_template`; `kwargs` go to its constructor."""
    vocab, merges = byte_level_vocab(vocab_size, special_tokens)
    tokenizer = tokenizer_class(vocab=vocab, merges=merges, **kwargs)
    tokenizer.add_special_tokens({"additional_special_tokens": list(special_tokens.values())},
                                 replace_extra_special_tokens=False)
    if len(tokenizer) != vocab_size:
        raise RuntimeError(f"tiny tokenizer has {len(tokenizer)} tokens, expected {vocab_size}")
    tokenizer.chat_template = chat_template
    return tokenizer
