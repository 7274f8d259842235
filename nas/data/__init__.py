"""Token data: sources (builtin text, files, ``.npy``, llm.c shards), the on-disk cache, and batches."""

from nas.data.loading import (
    BatchSampler,
    TokenData,
    check_enough_tokens,
    check_vocabulary,
    load_data,
    validation_batches,
)

__all__ = ["BatchSampler", "TokenData", "check_enough_tokens", "check_vocabulary", "load_data", "validation_batches"]
