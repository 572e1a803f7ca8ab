"""The text each token adds to a decoded sequence, for logs that show tokens one by one.

Decoding a token alone breaks characters whose bytes a byte-level BPE tokenizer spreads over
several tokens (SmolLM2 writes `÷` as two tokens, each of which decodes alone to `�`), and drops the
leading space that a SentencePiece tokenizer strips from the first token of a text. So each token's
text is read from the decoded prefix instead: decode(ids[:i+1]) minus decode(ids[:i]), over a
window of a few tokens before it, as vLLM's incremental detokenizer does. A token in the middle of
a character gets "" and the token that completes it gets the whole character, so the texts of a
sequence join to its decoded text. Bytes of a character that the sequence never completes (a chain
cut off inside one) are not shown.
"""

from __future__ import annotations

from collections.abc import Sequence

WINDOW = 6  # tokens of left context decoded with each token
MAX_CHAR_TOKENS = 4  # a UTF-8 character has at most 4 bytes, so it spans at most 4 byte tokens
INCOMPLETE = "\ufffd"  # what a tokenizer decodes an unfinished UTF-8 sequence to


def token_texts(tokenizer, ids: Sequence[int]) -> list[str]:
    """One string per id: the text that id adds to tokenizer.decode(ids) (special tokens shown)."""
    ids = list(ids)

    def decode(lo: int, hi: int) -> str:
        return tokenizer.decode(ids[lo:hi], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    out: list[str] = []
    start = 0  # the first token whose text is not out yet
    for i in range(len(ids)):
        lo = max(0, start - WINDOW)
        text = decode(lo, i + 1)
        if text.endswith(INCOMPLETE) and i + 1 - start < MAX_CHAR_TOKENS:
            out.append("")  # a character in the making: its last token will carry it
            continue
        out.append(text[len(decode(lo, start)):])
        start = i + 1
    return out
