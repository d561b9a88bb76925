"""scripts/race_corpus.py's tokenizer: a Hugging Face tokenizer.json built from tiktoken-style BPE
ranks (GPT-2's, in the real corpus) encodes text exactly as tiktoken does with the same ranks. Here
on ranks learned from a small text by merging the most frequent pair (the script itself checks
the real GPT-2 ranks on every document of the corpus it writes), plus the merge recovery's
refusal of ranks that are not merges, and the byte symbols' bijection."""

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

tiktoken = pytest.importorskip("tiktoken")
pytest.importorskip("tokenizers")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "race_corpus.py"
spec = importlib.util.spec_from_file_location("race_corpus", SCRIPT)
race_corpus = importlib.util.module_from_spec(spec)
spec.loader.exec_module(race_corpus)

TEXT = ("The quick brown fox jumps over the lazy dog. It's the dog's day; they'll say we've won, "
        "I'm sure, and you'd agree.\n\n  Indented   spaces\tand tabs 12345 67.89 -- naïve café "
        "résumé Ünïcödé ✓ 漢字 emoji 🙂 and\r\nWindows lines. " * 3)


def learned_ranks(text: str, merges: int) -> dict:
    """Byte-level BPE ranks: the 256 bytes, then `merges` times the most frequent adjacent pair of
    the words (split before spaces) merged into a new token of the next rank (ties: the first seen)."""
    ranks = {bytes([b]): b for b in range(256)}
    words = [[bytes([b]) for b in w.encode()] for w in text.replace(" ", "\0 ").split("\0") if w]
    for _ in range(merges):
        pairs = Counter(p for w in words for p in zip(w, w[1:]))
        if not pairs:
            break
        (a, b), _ = pairs.most_common(1)[0]
        if a + b in ranks:
            break
        ranks[a + b] = len(ranks)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [a + b]
                i += 1
    return ranks


def test_byte_symbols_are_a_bijection_onto_printable_characters():
    symbols = race_corpus.byte_symbols()
    assert len(set(symbols)) == 256 and all(s.isprintable() and not s.isspace() for s in symbols)
    assert symbols[ord("A")] == "A" and symbols[ord(" ")] == "\u0120" and symbols[ord("\n")] == "\u010a"


def test_tokenizer_json_encodes_as_tiktoken_does(tmp_path):
    from tokenizers import Tokenizer

    ranks = learned_ranks(TEXT, 150)
    assert len(ranks) > 256 + 100
    path = tmp_path / "tokenizer.json"
    path.write_text(race_corpus.gpt2_tokenizer_json(ranks))
    hf = Tokenizer.from_file(str(path))
    ref = race_corpus.tiktoken_encoding(ranks)
    for text in (TEXT, "the dog's fox, quick!", "   leading spaces and trailing   ", "x" * 100, "Ünï 🙂\n\n\n"):
        ids = hf.encode(text).ids
        assert ids == ref.encode_ordinary(text), text
        assert hf.decode(ids) == text
    assert hf.token_to_id(race_corpus.EOT) == len(ranks)
    assert hf.encode(f"a{race_corpus.EOT}b").ids == ref.encode(f"a{race_corpus.EOT}b", allowed_special="all")


def test_overlapping_merges_apply_in_rank_order(tmp_path):
    """Pairs that compete for a byte (ab / bc / ca): the lower rank wins, as in tiktoken; merges
    listed in another order would split these words otherwise."""
    from tokenizers import Tokenizer

    ranks = {bytes([b]): b for b in range(256)}
    for token in (b"bc", b"ab", b"ca", b"abc", b"bca", b"cab"):
        ranks[token] = len(ranks)
    hf = Tokenizer.from_str(race_corpus.gpt2_tokenizer_json(ranks))
    ref = race_corpus.tiktoken_encoding(ranks)
    for text in ("abc", "bca", "cab", "abcabca", "cabcab bcab", "aabbcc"):
        assert hf.encode(text).ids == ref.encode_ordinary(text), text
    # a, b, c, a: bc (256) before ab (257) and ca (258); then a+bc = abc (259) before bc+a (260)
    assert hf.encode("abca").ids == [ranks[b"abc"], ord("a")]


def test_ranks_that_are_not_merges_are_refused():
    ranks = {bytes([b]): b for b in range(256)}
    ranks[b"abc"] = 256  # no lower-ranked pair builds it
    with pytest.raises(ValueError, match="not one merge"):
        race_corpus.gpt2_tokenizer_json(ranks)
    with pytest.raises(ValueError, match="every single byte"):
        race_corpus.gpt2_tokenizer_json({b"a": 0})
