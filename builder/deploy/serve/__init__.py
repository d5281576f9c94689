"""How an image is served: the serve plan, derived once, and its two renderings.

  plan.py        ServePlan: the strategy's launch line, the model and drafter mounts, GPUs and tensor parallelism,
                 shm, port, the boot budget (BootBudget, from the image's measured boot seconds) and the probes
  fit.py         what fits the plan to where it runs: the GPUs' compute capabilities the image's device code runs on
                 (read from its labels as doctor --host reads them), the GPU product, and how the engine stops (its
                 drain flag from the engine data, the grace before SIGKILL)
  docker.py      the exact `docker run` of the plan
  kube.py        the Kubernetes manifests of the plan (lightkube's typed models)

It imports runtime/ (the GPUs) and the loose modules of deploy/; never smoke/, bench/ or warm/
(tests/unit/project/test_layers.py). The verb is builder/cli/serve.py.
"""
