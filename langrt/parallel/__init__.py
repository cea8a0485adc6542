"""Tensor parallelism (`--tp-size N`): `layout` (which heads, MLP rows and vocabulary rows each
rank holds), `shard` (a rank's slices of the checkpoint, GGUF blocks included), `group` (the
torch.distributed group: sums, the logits' gather, broadcasts), `shm` (CPU ranks' small sums
through shared memory), `worker` (ranks 1..N-1, which run what rank 0, the scheduler, broadcasts)."""
