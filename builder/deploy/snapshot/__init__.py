"""A booted engine's snapshot (issue 52): the engine booted, asked smoke L3's request, quiesced, its CUDA processes
checkpointed through the driver's API and its process tree dumped by CRIU (>= 4), stored with the key that must hold
to restore it; restored in a fresh PID namespace, refused before restore where the key does not hold.

  key.py      what must match to restore: GPU names and count, driver, the image's digest (or the process route's
              venv), the model's config sha256, the launch line, TP; read, written, compared
  criu.py     CRIU found and judged (>= 4), the dump and restore lines, the tree of a pid
  cuda.py     the CUDA processes of a tree and their checkpoint (NVIDIA's cuda-checkpoint, or cuda_checkpoint.c
              built where cuda.h and libcuda are)
  place.py    where the engine runs: a container with the capabilities CRIU needs (docker), or this host (process)
  take.py     boot, request, quiesce, checkpoint, dump, key: `builder snapshot take`
  restore.py  judge the key, restore, wake, check the answer, or kill what was restored: `builder snapshot restore`

It stands on runtime/ (the engine client, the GPUs, the model config's hash); runtime/ never imports it. The verb is
builder/cli/snapshot.py.
"""
