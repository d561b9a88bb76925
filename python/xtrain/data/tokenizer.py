"""Tokenizers: one `Tokenizer` interface, four kinds behind it.

    kind           made from                                 saved (dataset, checkpoint) as
    bpe            a byte-level BPE trained on the corpus    tokenizer.json
    gpt2           tiktoken's GPT-2                          tiktoken.json
    hf             a Hugging Face tokenizer.json             tokenizer.json + tokenizer_config.json
    sentencepiece  a SentencePiece .model                    tokenizer.model + tokenizer_config.json

- `bpe`: trained with Hugging Face `tokenizers` (ByteLevel pre-tokenizer and decoder,
  `<|endoftext|>` as the only special token, id 0).
- `gpt2`: the GPT-2 BPE through `tiktoken`, usable only when tiktoken is installed and its GPT-2
  files are already in its cache (no download is attempted: training machines are often offline).
  Saved as `tiktoken.json`, a small record naming the encoding and its fingerprint.
- `hf` and `sentencepiece` are brought by the user (`open_tokenizer(path)`). Their end-of-text id
  is the rule in `find_eot`; saving writes a `tokenizer_config.json` naming it as `eos_token`,
  so the saved files are what `transformers.AutoTokenizer` loads and what loading reads back.

Invariants: the fingerprint depends only on what maps text to ids (vocabulary, merges, special
tokens, the end-of-text id; for foreign files, the file's own content), never on how a library
version serialises it, so it can be stored in shard headers and compared across machines. For the
byte-level kinds (bpe, gpt2, and hf files with a byte-level pre-tokenizer and no normalizer)
decode(encode(text)) == text; SentencePiece normalises (by default NFKC and whitespace runs).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .bounded import MAX_JSON_BYTES, MAX_TOKENIZER_BYTES, read_bounded, read_text_bounded
from .errors import DataError

EOT_TEXT = "<|endoftext|>"
BPE_FILE = "tokenizer.json"
TIKTOKEN_FILE = "tiktoken.json"
SPM_FILE = "tokenizer.model"
CONFIG_FILE = "tokenizer_config.json"
# What each kind saves, its main file first: the only tokenizer files a dataset or checkpoint has.
TOKENIZER_FILES = {
    "bpe": (BPE_FILE,),
    "gpt2": (TIKTOKEN_FILE,),
    "hf": (BPE_FILE, CONFIG_FILE),
    "sentencepiece": (SPM_FILE, CONFIG_FILE),
}
# The end-of-text tokens of well-known tokenizers (GPT-2/NeoX/Qwen, Llama 3, Llama 2/Mistral/T5
# and SentencePiece's default, Gemma), tried in this order when nothing names one.
EOT_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
# 256 byte symbols plus the end-of-text token: the smallest vocabulary a byte-level BPE can have.
MIN_BPE_VOCAB = 257
# Pairs seen once are noise from a single document; skipping them keeps the vocabulary useful.
BPE_MIN_FREQUENCY = 2
# Where tiktoken fetches GPT-2 from; its cache names files by the sha1 of these URLs.
GPT2_URLS = (
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
)
SPM_HINT = "pip install sentencepiece (or: pip install 'xtrain[sentencepiece]')"


class Tokenizer:
    """Text <-> token ids. Subclasses set `kind`, `files`, `vocab_size`, `eot_id`,
    `fingerprint` and implement encode, decode, eot_text, `_file_bytes` and `_hf_class`."""

    kind: str
    files: tuple[str, ...]  # what save() writes, the main file first
    vocab_size: int         # one more than the largest id: the rows an embedding needs
    eot_id: int
    fingerprint: str        # 32 hex digits (128 bits of a sha256)

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.vocab_size}"

    @property
    def eot_text(self) -> str:
        """The end-of-text token as a string (what tokenizer_config.json calls eos_token)."""
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`; ids outside the vocabulary (a model's vocabulary may be larger,
        rounded up) decode to nothing."""
        raise NotImplementedError

    def _known(self, ids: Iterable[int]) -> list[int]:
        return [int(i) for i in ids if 0 <= int(i) < self.vocab_size]

    def save(self, directory: str | os.PathLike) -> Path:
        """Write `self.files` into `directory` (each atomically); return the main file's path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in self._file_bytes().items():
            _atomic_write(directory / name, data)
        return directory / self.files[0]

    def hf_files(self, model_max_length: int | None = None) -> dict[str, bytes]:
        """The files of this tokenizer that `transformers.AutoTokenizer` loads (an export)."""
        main = self.files[0]
        return {main: self._file_bytes()[main], CONFIG_FILE: self._hf_config(model_max_length)}

    @staticmethod
    def load(directory: str | os.PathLike, kind: str | None = None) -> "Tokenizer":
        return load_tokenizer(directory, kind)

    def _file_bytes(self) -> dict[str, bytes]:
        raise NotImplementedError

    def _hf_config(self, model_max_length: int | None, **extra) -> bytes:
        """tokenizer_config.json: the end-of-text token as bos/eos/pad (documents are preceded by
        it), nothing added around encoded text, so AutoTokenizer's ids with
        add_special_tokens=False are xtrain's."""
        config = {"tokenizer_class": self._hf_class, "bos_token": self.eot_text,
                  "eos_token": self.eot_text, "pad_token": self.eot_text,
                  "unk_token": self._unk_text(), "add_bos_token": False, "add_eos_token": False,
                  "clean_up_tokenization_spaces": False, **extra}
        if model_max_length is not None:
            config["model_max_length"] = model_max_length
        return _json_bytes(config)

    _hf_class = "PreTrainedTokenizerFast"

    def _unk_text(self) -> str | None:
        return None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, eot_id={self.eot_id}, "
                f"fingerprint={self.fingerprint!r})")


class _RustTokenizer(Tokenizer):
    """A Hugging Face `tokenizers.Tokenizer` (Rust): encode_batch is multi-threaded."""

    _tok = None
    _text = ""  # the tokenizer.json this was loaded from, saved and exported byte for byte

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # Rust-side and multi-threaded: the fast path prepare() uses.
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(self._known(ids), skip_special_tokens=False)

    @property
    def eot_text(self) -> str:
        return self._tok.id_to_token(self.eot_id)


class BPETokenizer(_RustTokenizer):
    """The byte-level BPE xtrain trains (train_bpe); `<|endoftext|>` is its end of text."""

    kind = "bpe"
    files = TOKENIZER_FILES["bpe"]

    def __init__(self, hf_tokenizer, text: str | None = None):
        self._tok = hf_tokenizer
        self._text = text if text is not None else hf_tokenizer.to_str(pretty=True)
        eot = hf_tokenizer.token_to_id(EOT_TEXT)
        if eot is None:
            raise DataError(f"tokenizer has no {EOT_TEXT!r} token")
        self.eot_id = eot
        self.vocab_size = hf_tokenizer.get_vocab_size(with_added_tokens=True)
        self.fingerprint = _bpe_fingerprint(hf_tokenizer)

    def _file_bytes(self) -> dict[str, bytes]:
        return {BPE_FILE: self._text.encode()}


class HFTokenizer(_RustTokenizer):
    """Any Hugging Face tokenizer.json (BPE, WordPiece, Unigram, ...), with the end-of-text id of
    `find_eot`. Encoding adds nothing around the text (no BOS from a post-processor)."""

    kind = "hf"
    files = TOKENIZER_FILES["hf"]

    def __init__(self, text: str, eot: str | None = None, config: dict | None = None,
                 source: str = BPE_FILE):
        from tokenizers import Tokenizer as RustTokenizer

        try:
            spec = json.loads(text)
            tok = RustTokenizer.from_str(text)
        except Exception as e:  # JSONDecodeError, or tokenizers' bare Exception
            raise DataError(f"{source}: not a valid tokenizer.json ({_first_line(e)})") from None
        tok.no_truncation()  # a document is never cut, whatever the file asked
        tok.no_padding()
        vocab = tok.get_vocab(with_added_tokens=True)
        if not vocab:
            raise DataError(f"{source}: the tokenizer has an empty vocabulary")
        self._tok, self._text, self._spec = tok, text, spec
        self.vocab_size = max(vocab.values()) + 1
        self.eot_id = find_eot(source, eot, config, tok.token_to_id)
        self.fingerprint = _json_fingerprint(spec, self.eot_id)

    def _file_bytes(self) -> dict[str, bytes]:
        return {BPE_FILE: self._text.encode(), CONFIG_FILE: self._hf_config(None)}

    def _unk_text(self) -> str | None:
        model = self._spec.get("model") if isinstance(self._spec, dict) else None
        unk = model.get("unk_token") if isinstance(model, dict) else None
        return unk if isinstance(unk, str) else None


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model (`sentencepiece` package), with the end-of-text id of `find_eot`
    (the model's own eos piece unless something else names one)."""

    kind = "sentencepiece"
    files = TOKENIZER_FILES["sentencepiece"]
    _hf_class = "SentencePieceBackend"  # transformers >= 5: sentencepiece itself, ids unchanged

    def __init__(self, model: bytes, eot: str | None = None, config: dict | None = None,
                 source: str = SPM_FILE):
        spm = import_sentencepiece()
        sp = spm.SentencePieceProcessor()
        try:
            sp.LoadFromSerializedProto(model)
        except Exception as e:  # RuntimeError or a protobuf DecodeError
            raise DataError(f"{source}: not a SentencePiece model ({_first_line(e)})") from None
        self._sp, self._model = sp, model
        self.vocab_size = sp.get_piece_size()
        native = sp.eos_id() if 0 <= sp.eos_id() < self.vocab_size else None
        self.eot_id = find_eot(source, eot, config, self._piece_id, native)
        digest = hashlib.sha256(f"sentencepiece|{self.eot_id}|".encode() + model)
        self.fingerprint = digest.hexdigest()[:32]

    def _piece_id(self, piece: str) -> int | None:
        i = self._sp.piece_to_id(piece)  # an unknown piece gives the unk id: check it round-trips
        return i if 0 <= i < self.vocab_size and self._sp.id_to_piece(i) == piece else None

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts), num_threads=min(8, os.cpu_count() or 1))

    def decode(self, ids: Iterable[int]) -> str:
        return self._sp.decode(self._known(ids))

    @property
    def eot_text(self) -> str:
        return self._sp.id_to_piece(self.eot_id)

    def _file_bytes(self) -> dict[str, bytes]:
        return {SPM_FILE: self._model, CONFIG_FILE: self._hf_config(None)}

    def _hf_config(self, model_max_length: int | None, **extra) -> bytes:
        # legacy: encode with sentencepiece as it is (no prefix-space rewriting)
        return super()._hf_config(model_max_length, legacy=True, **extra)

    def _unk_text(self) -> str | None:
        unk = self._sp.unk_id()
        return self._sp.id_to_piece(unk) if 0 <= unk < self.vocab_size else None


class GPT2Tokenizer(Tokenizer):
    """GPT-2 BPE through tiktoken (50257 ids, end-of-text is 50256)."""

    kind = "gpt2"
    files = TOKENIZER_FILES["gpt2"]
    eot_text = EOT_TEXT

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
        return self._enc.decode(self._known(ids))

    def _file_bytes(self) -> dict[str, bytes]:
        record = {"kind": "gpt2", "encoding": "gpt2", "vocab_size": self.vocab_size,
                  "eot_id": self.eot_id, "fingerprint": self.fingerprint}
        return {TIKTOKEN_FILE: (json.dumps(record, indent=2) + "\n").encode()}

    def hf_files(self, model_max_length: int | None = None) -> dict[str, bytes]:
        raise DataError("a GPT-2 (tiktoken) tokenizer has no Hugging Face files to export; "
                        "prepare the data with --tokenizer bpe or a tokenizer.json to export a run")


# ---- the end-of-text rule

def find_eot(source: str, eot: str | None, config: dict | None,
             lookup: Callable[[str], int | None], native: int | None = None) -> int:
    """The end-of-text id of a foreign tokenizer, first of:
    1. `eot` (the token's text: `xtrain prepare --eot TOKEN`), which must be in the vocabulary;
    2. the `eos_token` of the tokenizer_config.json beside the file, which must be too;
    3. the model's own end-of-sequence id (SentencePiece's eos piece, `native`);
    4. the first of EOT_CANDIDATES in the vocabulary.
    Else a DataError asking for `eot`."""
    if eot is not None:
        i = lookup(eot)
        if i is None:
            raise DataError(f"end-of-text token {eot!r} is not in the vocabulary of {source}")
        return i
    named = _config_eos(config, source)
    if named is not None:
        i = lookup(named)
        if i is None:
            raise DataError(f"{source}: tokenizer_config.json names eos_token {named!r}, which "
                            f"is not in the vocabulary; name the end-of-text token with --eot")
        return i
    if native is not None:
        return native
    for candidate in EOT_CANDIDATES:
        i = lookup(candidate)
        if i is not None:
            return i
    raise DataError(f"cannot tell which token of {source} ends a document: no "
                    f"tokenizer_config.json eos_token, no eos piece, and none of "
                    f"{', '.join(EOT_CANDIDATES)} in its vocabulary; name it with --eot TOKEN")


def _config_eos(config: dict | None, source: str) -> str | None:
    if not config or config.get("eos_token") is None:
        return None
    eos = config["eos_token"]
    if isinstance(eos, dict):  # an AddedToken written out: {"content": "</s>", ...}
        eos = eos.get("content")
    if not isinstance(eos, str) or not eos:
        raise DataError(f"{source}: tokenizer_config.json has an eos_token that is not a token "
                        f"({str(config['eos_token'])[:40]}); name the end-of-text token with --eot")
    return eos


# ---- making and opening tokenizers

def train_bpe(texts: Iterable[str], vocab_size: int) -> BPETokenizer:
    """Train a byte-level BPE with at most `vocab_size` ids on `texts`.

    The result can be smaller than asked when the corpus runs out of pairs worth merging; the
    tokenizer's `vocab_size` is the real size.
    """
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    if not MIN_BPE_VOCAB <= vocab_size < 2**32:
        raise DataError(f"vocab_size must be in [{MIN_BPE_VOCAB}, 2**32), got {vocab_size}")
    tok = RustTokenizer(models.BPE())
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


def open_tokenizer(spec: str | os.PathLike, eot: str | None = None) -> Tokenizer:
    """The tokenizer a user names: "gpt2", a Hugging Face tokenizer.json, a SentencePiece .model,
    or a directory holding one of them (a tokenizer_config.json beside it is read for its
    eos_token). `eot` names the end-of-text token of a file (see find_eot)."""
    if str(spec) == "gpt2":
        if eot is not None:
            raise DataError("--eot applies to a tokenizer file; GPT-2's end of text is fixed")
        return gpt2_tokenizer()
    path = Path(spec)
    if path.is_dir():
        models = sorted(path.glob("*.model"))
        if (path / BPE_FILE).is_file():
            path = path / BPE_FILE
        elif (path / SPM_FILE).is_file() or len(models) == 1:
            path = path / SPM_FILE if (path / SPM_FILE).is_file() else models[0]
        else:
            raise DataError(f"tokenizer {spec}: the directory holds no {BPE_FILE} and no single "
                            f"SentencePiece .model")
    elif not path.is_file():
        raise DataError(f"tokenizer {spec}: no such file or directory (expected bpe, gpt2, a "
                        f"tokenizer.json, a SentencePiece .model or a directory holding one)")
    config = read_tokenizer_config(path.parent / CONFIG_FILE)
    if path.suffix == ".model":
        return SentencePieceTokenizer(_read(path, bytes), eot, config, source=str(path))
    if path.suffix == ".json":
        return HFTokenizer(_read(path, str), eot, config, source=str(path))
    raise DataError(f"tokenizer {spec}: expected a Hugging Face tokenizer .json or a "
                    f"SentencePiece .model file")


def load_tokenizer(directory: str | os.PathLike, kind: str | None = None) -> Tokenizer:
    """Load the tokenizer saved in `directory` (by Tokenizer.save). `kind` is the recorded kind
    (meta.json, state.json); without it the files present decide."""
    directory = Path(directory)
    if kind is None:
        kind = _saved_kind(directory)
    if kind not in TOKENIZER_FILES:
        raise DataError(f"unknown tokenizer kind {kind!r} (known: {', '.join(TOKENIZER_FILES)})")
    missing = [n for n in TOKENIZER_FILES[kind] if not (directory / n).is_file()]
    if missing:
        raise DataError(f"no tokenizer in {directory} (a {kind} tokenizer needs "
                        f"{' and '.join(TOKENIZER_FILES[kind])}; missing {', '.join(missing)})")
    main = directory / TOKENIZER_FILES[kind][0]
    if kind == "bpe":
        from tokenizers import Tokenizer as RustTokenizer

        text = _read(main, str)
        try:
            return BPETokenizer(RustTokenizer.from_str(text), text)
        except Exception as e:  # tokenizers raises a bare Exception for a malformed file
            raise DataError(f"{main}: not a valid tokenizer file ({_first_line(e)})") from None
    if kind == "gpt2":
        try:
            record = json.loads(read_text_bounded(main, MAX_JSON_BYTES, "tokenizer record"))
        except (json.JSONDecodeError, RecursionError) as e:
            raise DataError(f"{main}: invalid JSON ({e})") from None
        tok = gpt2_tokenizer()
        if not isinstance(record, dict) or record.get("fingerprint") != tok.fingerprint:
            saved = record.get("fingerprint") if isinstance(record, dict) else None
            raise DataError(f"{main}: the installed tiktoken GPT-2 tokenizer (fingerprint "
                            f"{tok.fingerprint}) differs from the saved one ({saved})")
        return tok
    config = read_tokenizer_config(directory / CONFIG_FILE)
    if kind == "hf":
        return HFTokenizer(_read(main, str), None, config, source=str(main))
    return SentencePieceTokenizer(_read(main, bytes), None, config, source=str(main))


def read_tokenizer_config(path: Path) -> dict | None:
    """A tokenizer_config.json as a dict, None when there is none."""
    if not path.is_file():
        return None
    try:
        config = json.loads(read_text_bounded(path, MAX_JSON_BYTES, "tokenizer config"))
    except (json.JSONDecodeError, RecursionError) as e:
        raise DataError(f"{path}: invalid JSON ({e})") from None
    if not isinstance(config, dict):
        raise DataError(f"{path}: expected a JSON object")
    return config


def _saved_kind(directory: Path) -> str:
    if (directory / TIKTOKEN_FILE).is_file():
        return "gpt2"
    if (directory / SPM_FILE).is_file():
        return "sentencepiece"
    if (directory / BPE_FILE).is_file():
        return "hf" if (directory / CONFIG_FILE).is_file() else "bpe"
    raise DataError(f"no tokenizer in {directory} (expected {BPE_FILE}, {TIKTOKEN_FILE} or "
                    f"{SPM_FILE})")


def import_sentencepiece():
    try:
        import sentencepiece
    except ImportError:
        raise DataError(f"a SentencePiece tokenizer needs the `sentencepiece` package, which is "
                        f"not installed: {SPM_HINT}") from None
    return sentencepiece


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


# ---- fingerprints and files

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


def _json_fingerprint(spec: dict, eot_id: int) -> str:
    # A foreign tokenizer.json, hashed from the file itself (not from a library's re-serialisation)
    # with merges in one spelling and without the parts that do not map text to ids.
    spec = {k: v for k, v in spec.items() if k not in ("version", "truncation", "padding")}
    model = spec.get("model")
    if isinstance(model, dict) and isinstance(model.get("merges"), list):
        merges = [m if isinstance(m, str) else " ".join(map(str, m)) for m in model["merges"]]
        spec["model"] = {**model, "merges": merges}
    canonical = json.dumps({"kind": "hf", "eot_id": eot_id, "spec": spec}, sort_keys=True,
                           ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _type_of(component) -> str | None:
    return component.get("type") if isinstance(component, dict) else None


def _read(path: Path, kind: type):
    """A tokenizer's file, bounded (bounded.MAX_TOKENIZER_BYTES), as bytes or UTF-8 text."""
    if kind is bytes:
        return read_bounded(path, MAX_TOKENIZER_BYTES, "tokenizer file")
    return read_text_bounded(path, MAX_TOKENIZER_BYTES, "tokenizer file")


def _json_bytes(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _atomic_write(path: Path, data: bytes) -> None:
    # Write then rename: a crash never leaves a half-written tokenizer beside good shards.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
