"""The one exception type of the data pipeline.

Every problem with data on disk or with a request (missing or mismatched tokenizer, truncated shard,
unreadable source, shard too short for a window) raises `DataError`, so callers catch one type and
never see a crash or a bare KeyError from deep inside a reader.
"""


class DataError(ValueError):
    """A dataset, shard, tokenizer or source is missing, malformed or does not match the request."""
