"""Tokenizers: one `Tokenizer` interface, two kinds behind it.

- `bpe`: a byte-level BPE trained on the corpus with Hugging Face `tokenizers` (ByteLevel
  pre-tokenizer and decoder, `<|endoftext|>` as the only special token). Saved as `tokenizer.json`,
  the file `transformers` loads directly, so an export can ship it unchanged.
- `gpt2`: the GPT-2 BPE through `tiktoken`, usable only when tiktoken is installed and its GPT-2
  files are already in its cache (no download is attempted: training machines are often offline).
  Saved as `tiktoken.json`, a small record naming the encoding and its fingerprint.

Invariants: decode(encode(text)) == text for any text (both kinds are byte-level and there is no
normalizer); the fingerprint depends only on what maps text to ids (vocabulary, merges, special
tokens), never on serialization details of a library version, so it can be stored in shard headers
and compared across machines.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

from .errors import DataError

EOT_TEXT = "<|endoftext|>"
BPE_FILE = "tokenizer.json"
TIKTOKEN_FILE = "tiktoken.json"
# 256 byte symbols plus the end-of-text token: the smallest vocabulary a byte-level BPE can have.
MIN_BPE_VOCAB = 257
# Pairs seen once are noise from a single document; skipping them keeps the vocabulary useful.
BPE_MIN_FREQUENCY = 2
# Where tiktoken fetches GPT-2 from; its cache names files by the sha1 of these URLs.
GPT2_URLS = (
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
)


class Tokenizer:
    """Text <-> token ids. Subclasses set `kind`, `vocab_size`, `eot_id` and `fingerprint`."""

    kind: str
    vocab_size: int
    eot_id: int
    fingerprint: str  # 32 hex digits (128 bits of a sha256)
    eot_text = EOT_TEXT

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.vocab_size}"

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def save(self, directory: str | os.PathLike) -> Path:
        raise NotImplementedError

    @staticmethod
    def load(directory: str | os.PathLike) -> "Tokenizer":
        return load_tokenizer(directory)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, eot_id={self.eot_id}, "
                f"fingerprint={self.fingerprint!r})")


class BPETokenizer(Tokenizer):
    """Byte-level BPE backed by a Hugging Face `tokenizers.Tokenizer`."""

    kind = "bpe"

    def __init__(self, hf_tokenizer):
        self._tok = hf_tokenizer
        eot = hf_tokenizer.token_to_id(EOT_TEXT)
        if eot is None:
            raise DataError(f"tokenizer has no {EOT_TEXT!r} token")
        self.eot_id = eot
        self.vocab_size = hf_tokenizer.get_vocab_size(with_added_tokens=True)
        self.fingerprint = _bpe_fingerprint(hf_tokenizer)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # Rust-side and multi-threaded: the fast path prepare() uses.
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, directory: str | os.PathLike) -> Path:
        path = Path(directory) / BPE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, self._tok.to_str(pretty=True))
        return path


class GPT2Tokenizer(Tokenizer):
    """GPT-2 BPE through tiktoken (50257 ids, end-of-text is 50256)."""

    kind = "gpt2"

    def __init__(self, encoding):
        self._enc = encoding
        self.vocab_size = encoding.n_vocab
        self.eot_id = encoding.eot_token
        digest = hashlib.sha256(f"gpt2|{self.vocab_size}|{self.eot_id}".encode())
        for i in range(self.vocab_size):
            digest.update(encoding.decode_single_token_bytes(i) + b"\0")
        self.fingerprint = digest.hexdigest()[:32]

    def encode(self, text: str) -> list[int]:
        # Ordinary: a literal "<|endoftext|>" inside a document is text, not a boundary.
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._enc.encode_ordinary_batch(list(texts))

    def decode(self, ids: Iterable[int]) -> str:
        return self._enc.decode([int(i) for i in ids])

    def save(self, directory: str | os.PathLike) -> Path:
        path = Path(directory) / TIKTOKEN_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"kind": "gpt2", "encoding": "gpt2", "vocab_size": self.vocab_size,
                  "eot_id": self.eot_id, "fingerprint": self.fingerprint}
        _atomic_write(path, json.dumps(record, indent=2) + "\n")
        return path


def train_bpe(texts: Iterable[str], vocab_size: int) -> BPETokenizer:
    """Train a byte-level BPE with at most `vocab_size` ids on `texts`.

    The result can be smaller than asked when the corpus runs out of pairs worth merging; the
    tokenizer's `vocab_size` is the real size.
    """
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    if not MIN_BPE_VOCAB <= vocab_size < 2**32:
        raise DataError(f"vocab_size must be in [{MIN_BPE_VOCAB}, 2**32), got {vocab_size}")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=BPE_MIN_FREQUENCY,
        special_tokens=[EOT_TEXT],  # first, so its id is 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer(tok)


def gpt2_unavailable_reason() -> str | None:
    """None when the tiktoken GPT-2 tokenizer can be built offline, else why it cannot."""
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return "tiktoken is not installed (pip install tiktoken)"
    # tiktoken's own cache lookup order (tiktoken/load.py).
    cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR") \
        or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    missing = [u for u in GPT2_URLS
               if not os.path.exists(os.path.join(cache, hashlib.sha1(u.encode()).hexdigest()))]
    if missing:
        return (f"the GPT-2 files are not in tiktoken's cache {cache} (missing {len(missing)} of "
                f"{len(GPT2_URLS)}); on a machine with network run "
                f"`python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\"` and copy the "
                f"cache")
    return None


def gpt2_tokenizer() -> GPT2Tokenizer:
    """The tiktoken GPT-2 tokenizer, or DataError saying why it is unavailable."""
    reason = gpt2_unavailable_reason()
    if reason is not None:
        raise DataError(f"tokenizer 'gpt2' is unavailable: {reason}. "
                        f"Use tokenizer='bpe' to train a byte-level BPE on the corpus instead.")
    import tiktoken

    try:
        return GPT2Tokenizer(tiktoken.get_encoding("gpt2"))
    except Exception as e:  # a corrupt cache surfaces as several exception types
        raise DataError(f"tokenizer 'gpt2' could not be loaded by tiktoken: {e}") from None


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
    """Load the tokenizer saved in `directory` (tokenizer.json or tiktoken.json)."""
    directory = Path(directory)
    bpe_path, tiktoken_path = directory / BPE_FILE, directory / TIKTOKEN_FILE
    if bpe_path.is_file():
        from tokenizers import Tokenizer as HFTokenizer

        try:
            return BPETokenizer(HFTokenizer.from_file(str(bpe_path)))
        except Exception as e:  # tokenizers raises a bare Exception for a malformed file
            raise DataError(f"{bpe_path}: not a valid tokenizer file ({e})") from None
    if tiktoken_path.is_file():
        try:
            record = json.loads(tiktoken_path.read_text())
        except json.JSONDecodeError as e:
            raise DataError(f"{tiktoken_path}: invalid JSON ({e.msg})") from None
        tok = gpt2_tokenizer()
        if record.get("fingerprint") != tok.fingerprint:
            raise DataError(f"{tiktoken_path}: the installed tiktoken GPT-2 tokenizer "
                            f"(fingerprint {tok.fingerprint}) differs from the saved one "
                            f"({record.get('fingerprint')})")
        return tok
    raise DataError(f"no tokenizer in {directory} (expected {BPE_FILE} or {TIKTOKEN_FILE})")


def _bpe_fingerprint(hf_tokenizer) -> str:
    # Hash what maps text to ids, normalised: newer `tokenizers` write merges as pairs, older as
    # "a b" strings, and the JSON carries fields that change between library versions.
    spec = json.loads(hf_tokenizer.to_str())
    model = spec["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    added = sorted((t["id"], t["content"]) for t in spec.get("added_tokens", []))
    canonical = json.dumps({"type": model["type"], "vocab": vocab, "merges": merges,
                            "added": added, "pre_tokenizer": _type_of(spec.get("pre_tokenizer")),
                            "normalizer": _type_of(spec.get("normalizer"))},
                           sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _type_of(component) -> str | None:
    return component.get("type") if isinstance(component, dict) else None


def _atomic_write(path: Path, text: str) -> None:
    # Write then rename: a crash never leaves a half-written tokenizer beside good shards.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
