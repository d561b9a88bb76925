"""xtrain.data: corpus readers, tokenizers, token shards, the batch loader and the built-in stories.

Pure Python (numpy, tokenizers, pyarrow for parquet, tqdm); nothing here uses the engine (it
reads its environment settings through xtrain.settings).

Typical use by the training loop:

    ds = open_stream()                                # the endless built-in stories, or
    ds = open_dataset(prepare(source, out_dir, ...))  # a prepared corpus (default_dataset(): a
                                                      # finite copy of the built-in stories)
    train = ds.loader("train", batch, seq, seed, rank, world_size)
    x, y = train.next_batch()                         # int64 (batch, seq) each
    for x, y in ds.loader("val", batch, seq, seed, rank, world_size).iter_eval(batch, seq, 20): ...
"""

from .dataset import Dataset, is_dataset_dir, open_dataset
from .errors import DataError
from .formats import detect_format
from .loader import TokenLoader
from .layout import read_meta
from .prepare import prepare
from .readers import iter_documents, list_source_files
from .shards import (ShardHeader, ShardWriter, TokenSplit, dtype_for_vocab, open_shard,
                     read_header, write_shard)
from .stories import generate_stories, write_corpus
from .stream import (StreamDataset, StreamLoader, default_cache_dir, default_dataset,
                     is_stream_dir, open_stream, write_stream_copy)
from .tokenizer import (TOKENIZER_FILES, BPETokenizer, GPT2Tokenizer, HFTokenizer,
                        SentencePieceTokenizer, Tokenizer, gpt2_tokenizer,
                        gpt2_unavailable_reason, load_tokenizer, open_tokenizer, train_bpe)
from .write import is_val_document

__all__ = [
    "BPETokenizer", "DataError", "Dataset", "GPT2Tokenizer", "HFTokenizer",
    "SentencePieceTokenizer", "ShardHeader", "ShardWriter", "StreamDataset", "StreamLoader",
    "TOKENIZER_FILES", "TokenLoader", "TokenSplit", "Tokenizer", "default_cache_dir",
    "default_dataset", "detect_format", "dtype_for_vocab", "generate_stories", "gpt2_tokenizer",
    "gpt2_unavailable_reason", "is_dataset_dir", "is_stream_dir", "is_val_document",
    "iter_documents", "list_source_files", "load_tokenizer", "open_dataset", "open_shard",
    "open_stream", "open_tokenizer", "prepare", "read_header", "read_meta", "train_bpe",
    "write_corpus", "write_shard", "write_stream_copy",
]
