"""Tensor parallelism over torch.distributed: one model split over several processes and hosts.

Rank 0 is the server process (HTTP, scheduler, block manager, sampler); ranks 1..N-1 are worker
processes that hold only their shard of the weights and of the KV cache. Each step rank 0
broadcasts the step's inputs, every rank runs the same forward over its shard, and an all-reduce
after each row-parallel projection (o_proj, down_proj) completes the residual stream on every rank.

  plan.py        which rows/columns of each weight a rank holds (Megatron sharding), validation
  shard_load.py  reading only a rank's shard of each weight (GGUF rows/blocks, safetensors slices)
  comm.py        the process group: the traceable all-reduce, the per-step broadcast of inputs
  step_io.py     a step's inputs packed into int64 tensors and back
  liveness.py    heartbeats, parent-death signal, process exit descriptions
  parent_death.py  a child process never outlives its parent (PR_SET_PDEATHSIG); no torch
  cluster.py     rank 0: rendezvous store, worker processes, load handshake, monitor, shutdown
  worker.py      a worker rank: load, handshake, then run steps until told to stop
  node.py        `rillet worker`: the ranks of another host
  runner.py      rank 0's runner: a failed step stops the engine, naming the rank at fault
"""
