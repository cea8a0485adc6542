"""Tensor parallelism (`--tp-size N`): `layout` (which heads, MLP rows and vocabulary rows each
rank holds), `shard` (a rank's slices of the checkpoint, GGUF blocks included), `group` (the
torch.distributed group: sums, the logits' gather, broadcasts), `worker` (ranks 1..N-1, which run
what rank 0, the scheduler, broadcasts)."""
