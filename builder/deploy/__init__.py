"""The deployer's side: what is done with an image once it is built — prove it (smoke), measure it (bench), print
how to run it (serve: `docker run` or Kubernetes manifests), make its first boot a warm boot (warm), judge whether it
runs on a host's GPUs (doctor --host). The image is the subject; no matrix is needed (one is used where given).

It imports nothing of the build (runner, steps, cache) nor the verbs (cli), and of builder/image/ only the image's
contract (labels, launch line; warm/ also the archive and publication it makes the warm image with). Its rooms import
only the rooms below them (tests/unit/project/test_layers.py DEPLOY_ROOMS):

  runtime/       the floor: where an engine runs (launchers, the boot loop), where its caches go and what a boot
                 wrote there, the image's paths on a host, this host's GPUs, a GPU host's environment
  smoke/         the layered proof (on runtime/)           bench/   the benchmark (on runtime/, smoke/)
  serve/         the serve plan, derived once, and its two renderings: docker run, Kubernetes (on runtime/)
  warm/          the warm image: capture (booting through smoke's L3), pack, restore (on runtime/, smoke/)
  subject.py     an image reference -> its config and labels (the local daemon, else its registry without
                 pulling, else a saved JSON) -> the engine recipe and cell from the built-in engine data
  strategies.py  the one reading of --strategy (check_strategy)   runflags.py  the flags that start an engine
  host.py        the rules of doctor --host
  gpuhost.py     scripts/gpu-host-run: a GPU host without Docker (runtime/hostenv.py, warm/restore.py, smoke, warm)
"""
