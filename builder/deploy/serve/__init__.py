"""How an image is served: the serve plan, derived once, and its two renderings.

  plan.py        ServePlan: the strategy's launch line, the model and drafter mounts, GPUs and tensor parallelism,
                 shm, port, the boot budget (BootBudget, from the image's measured boot seconds) and the probes
  docker.py      the exact `docker run` of the plan
  kube.py        the Kubernetes manifests of the plan (lightkube's typed models)

It imports runtime/ (the GPUs) and the loose modules of deploy/; never smoke/, bench/ or warm/
(tests/unit/project/test_layers.py). The verb is builder/cli/serve.py.
"""
