"""KV memory management without tensors: block pool, paged and contiguous managers, waste accounting."""
