"""The deployer's side: what is done with an image once it is built — prove it (smoke), measure it (bench),
print or run its `docker run` (serve), judge whether it runs on a host's GPUs (doctor --host). The image is the
subject; no matrix is needed (one is used where given). It imports nothing of the build (runner, steps, cache)
nor the verbs (cli): tests/test_layers.py holds it to that.

  subject.py     an image reference -> its config and labels (the local daemon, else its registry without
                 pulling, else a saved JSON) -> the engine recipe and cell from the built-in engine data
  gpus.py        this host's GPUs, read once from nvidia-smi, typed
  engine.py      the one engine runtime (a container through the docker SDK, or a process) and the running
                 engine: start, wait_ready, models, complete, metrics, log_tail, stop (smoke L3 and bench)
  strategies.py  the one reading of --strategy
  runflags.py    the flags that start an engine, as one typed value
  launchline.py  the engine's launch line (also the image's ENTRYPOINT, for render)
  smoke/         the layered proof        bench/   the benchmark        serve.py  the `docker run`
  host.py        the rules of doctor --host
  gpuhost.py     scripts/gpu-host-run: a GPU host without Docker (runtime/hostenv.py, warm/restore.py)
"""
