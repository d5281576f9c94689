"""Where an engine runs: the deployer's floor, which smoke, bench, serve and warm stand on.

  engine.py      the launchers (a container of the image through the docker SDK, the one client; or a process on a
                 GPU host without Docker) and the running engine: start, the one boot loop (wait_ready), models,
                 complete, metrics, log_tail, stop
  caches.py      CacheSetting, a returned value: where a run's compile caches go (from the image's labels, the cell, or
                 --cache-root) and the variables that point each cache there; and the cache watch: what a boot wrote
                 under the root (a container's diff and archive, a process's content snapshots)
  imagepaths.py  --image-paths: the interpreter, site-packages and CUDA_HOME of the image, checked on a host
  client.py      the docker SDK's client, made in this one place
  watchdog.py    the process that removes a run's containers when builder is killed outright (SIGKILL)
  gpus.py        this host's GPUs, read once from nvidia-smi (and their SM count from the CUDA driver), typed
  warmkey.py     a warm layer's key: what each compile cache is keyed on (builder/data/warmkeys.toml), the record
                 a capture writes (label io.builder.warm.key) and a launch line read into the key's parts
  warmjudge.py   the one judge: per cache, whether a boot reuses a warm layer, compiles, or cannot be judged, before
                 the boot (doctor --host, serve and smoke ask it; warm records the key it reads)
  hostenv.py     a GPU host without Docker: the carried wheel bundles (their spec through schema.py) and the venv at
                 the image's prefix, kept between boots

It imports no other room of deploy/ (smoke, bench, serve, warm): they take it, never the reverse
(tests/unit/project/test_layers.py).
"""
