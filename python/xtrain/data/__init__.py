"""xtrain.data: corpus readers, tokenizers, token shards, the batch loader and the built-in stories.

Pure Python (numpy, tokenizers, pyarrow for parquet, tqdm); nothing here imports the engine.

Typical use by the training loop:

    data_dir = default_dataset()                      # or prepare(source, out_dir, ...)
    ds = open_dataset(data_dir, model_vocab_size=cfg.vocab_size)
    train = ds.loader("train", batch, seq, seed, rank, world_size)
    x, y = train.next_batch()                         # int64 (batch, seq) each
    for x, y in ds.loader("val", batch, seq, seed, rank, world_size).iter_eval(batch, seq, 20): ...
"""

from .dataset import Dataset, open_dataset
from .errors import DataError
from .loader import TokenLoader
from .prepare import is_val_document, prepare, read_meta
from .readers import iter_documents, list_source_files
from .shards import ShardHeader, ShardWriter, dtype_for_vocab, open_shard, read_header, write_shard
from .stories import default_cache_dir, default_dataset, generate_stories, write_corpus
from .tokenizer import (BPETokenizer, GPT2Tokenizer, Tokenizer, gpt2_tokenizer,
                        gpt2_unavailable_reason, load_tokenizer, train_bpe)

__all__ = [
    "BPETokenizer", "DataError", "Dataset", "GPT2Tokenizer", "ShardHeader", "ShardWriter",
    "TokenLoader", "Tokenizer", "default_cache_dir", "default_dataset", "dtype_for_vocab",
    "generate_stories", "gpt2_tokenizer", "gpt2_unavailable_reason", "is_val_document",
    "iter_documents", "list_source_files", "load_tokenizer", "open_dataset", "open_shard",
    "prepare", "read_header", "read_meta", "train_bpe", "write_corpus", "write_shard",
]
