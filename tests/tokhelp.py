"""Tokenizers and token files built by the tests themselves (no downloads): a Hugging Face
tokenizer.json trained with `tokenizers`, a SentencePiece model trained with `sentencepiece`, a
stand-in for tiktoken's GPT-2, and nanoGPT / llm.c token files written in their exact formats."""

import hashlib
import io
import random
import sys
import types
from pathlib import Path

import numpy as np
import pytest

WORDS = ("once upon a time there was a little girl named lily she loved to play in the park with "
         "her dog max they ran and jumped all day until the sun went down").split()


def documents(n=400, seed=0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))).capitalize() + "."
            for _ in range(n)]


def write_corpus(path: Path, n=400) -> Path:
    path.write_text("\n\n".join(documents(n)))
    return path


def hf_tokenizer(root: Path, name="hf") -> Path:
    """A Llama-like tokenizer.json (NFKC, Metaspace, BPE, <unk> <s> </s>, a post-processor that
    adds <s>) in root/name; no tokenizer_config.json, so its end of text is found by name."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(documents(), trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    (root / name).mkdir(parents=True, exist_ok=True)
    tok.save(str(root / name / "tokenizer.json"))
    return root / name / "tokenizer.json"


def word_level_tokenizer(path: Path, n_words: int, eot: str | None = None) -> Path:
    """A tokenizer.json mapping whitespace-separated words w0 .. w{n-1} (and `eot`) to ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(n_words)}
    vocab["[UNK]"] = n_words
    if eot is not None:
        vocab[eot] = n_words + 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def spm_model(root: Path, name="m.model", **options) -> Path:
    """A small unigram SentencePiece model (eos </s> = 2 unless `options` say otherwise)."""
    spm = pytest.importorskip("sentencepiece", reason="sentencepiece is not installed "
                              "(pip install sentencepiece, or the test extras)")
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(documents()), model_writer=buf,
                                   vocab_size=80, hard_vocab_limit=False, model_type="unigram",
                                   minloglevel=2, **options)
    root.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(buf.getvalue())
    return root / name


class ByteEncoding:
    """Stands in for tiktoken's gpt2 Encoding (its files are not here): ids are bytes, eot is 256."""

    n_vocab, eot_token = 257, 256

    def encode_ordinary(self, text):
        return list(text.encode())

    def encode_ordinary_batch(self, texts):
        return [self.encode_ordinary(t) for t in texts]

    def decode_single_token_bytes(self, i):
        return b"<|endoftext|>" if i == 256 else bytes([i])

    def decode(self, ids):
        return b"".join(self.decode_single_token_bytes(i) for i in ids).decode(errors="replace")


def fake_gpt2(monkeypatch, cache: Path) -> None:
    """Make `gpt2` resolve to ByteEncoding: a tiktoken module and a filled tiktoken cache."""
    from xtrain.data import tokenizer as tokenizer_module

    fake = types.ModuleType("tiktoken")
    fake.get_encoding = lambda name: ByteEncoding()
    monkeypatch.setitem(sys.modules, "tiktoken", fake)
    cache.mkdir(parents=True, exist_ok=True)
    for url in tokenizer_module.GPT2_URLS:
        (cache / hashlib.sha1(url.encode()).hexdigest()).write_text("cached")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))


def token_stream(encode, docs, eot: int, eot_first: bool) -> np.ndarray:
    """Documents as one id stream: nanoGPT appends the eot to each, llm.c puts it first."""
    ids = []
    for doc in docs:
        ids += [eot] + encode(doc) if eot_first else encode(doc) + [eot]
    return np.array(ids, dtype=np.int64)


def write_nanogpt(directory: Path, train: np.ndarray, val: np.ndarray) -> Path:
    """nanoGPT's data/*/prepare.py output: raw uint16, no header."""
    directory.mkdir(parents=True, exist_ok=True)
    train.astype(np.uint16).tofile(directory / "train.bin")
    val.astype(np.uint16).tofile(directory / "val.bin")
    return directory


def write_llmc_shard(path: Path, tokens: np.ndarray, magic=20240520, version=1, count=None,
                     dtype=np.uint16) -> Path:
    """llm.c's dev/data/data_common.py output: 256 int32 (magic, version, count), then tokens."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = magic, version, len(tokens) if count is None else count
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(header.astype("<i4").tobytes())
        f.write(tokens.astype(np.dtype(dtype).newbyteorder("<")).tobytes())
    return path


def cli_run(capsys, *argv) -> tuple[int, str]:
    """`xtrain ARGV` in this process: (exit status, stderr)."""
    from xtrain.trainer import cli

    code = cli.main([str(a) for a in argv])
    return code, capsys.readouterr().err


def one_error_line(code: int, err: str, *needles: str) -> None:
    """The command failed with exit 2 and one `xtrain: error:` line holding every needle."""
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xtrain: error:"), err
    for needle in needles:
        assert needle in lines[0], err
