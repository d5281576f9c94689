"""The bad-input table for the manifests that fit the field (issue 45): `serve --kubernetes`'s --gpu-product,
--no-gpu-affinity, --rollout, --runtime-class and --hub-cache, and serve's --drain-timeout (docker and Kubernetes
alike), each refused before any image is looked up where its grammar alone decides (exit 2, one line naming the flag,
nothing written), and where the image decides (the engine's own drain flag against --engine-args, a hub cache where
the engine downloads nothing, a GPU family the image's device code does not run on) once its labels are read from
the image JSON, before a manifest is written. A few good values are served (exit 0), so that the table also shows
what each flag does."""

from __future__ import annotations

from tests.hardening.cases import Case
from tests.hardening.warm_serve import ARG, KUBE, SERVE, given, image_json

IMAGE = {"i.json": image_json()}
OUT = ["-o", "{tmp}/k.yaml"]  # a refused case must leave no manifest behind

CASES: list[Case] = []
add = CASES.append


def bad(name: str, flag: str, values: dict[str, str], says: tuple[str, ...], base=KUBE, files=IMAGE) -> None:
    for vname, v in values.items():
        add(Case(f"fit-{name}-{vname}", "serve-kube", [*base, flag, v, *OUT], files=files, expect=says))


# --gpu-product: GPU feature discovery's nvidia.com/gpu.product, a label value with dashes for spaces
bad("gpu-product", "--gpu-product", {"empty": "", "newline": "NVIDIA-H200\n", "slash": "NVIDIA/H200", "64": "N" * 64,
                                     "leading-dash": "-H200", "trailing-dot": "H200.", "unicode": "NVIDIA-H200-ü",
                                     "quote": "NVIDIA-H200'", "colon": "nvidia.com/gpu.product:H200",
                                     "long": "n" * ARG, "tab": "NVIDIA\tH200"}, ("--gpu-product", "not a GPU product"))
bad("gpu-product", "--gpu-product", {"spaces": "NVIDIA H200", "spaces-long-name": "NVIDIA H100 80GB HBM3"},
    ("--gpu-product", "GPU feature discovery writes the name with dashes"))
add(Case("fit-gpu-product-without-affinity", "serve-kube", [*KUBE, "--no-gpu-affinity", "--gpu-product", "NVIDIA-H200",
                                                            *OUT], files=IMAGE,
         expect=("--gpu-product", "--no-gpu-affinity leaves out")))
add(Case("fit-gpu-product-bad-before-the-image", "serve-kube", ["serve", "{tmp}/none.json", *KUBE[2:], "--gpu-product",
                                                                 "NVIDIA H200", *OUT],
         expect=("--gpu-product", "with dashes")))  # refused before the image JSON is read

# --no-gpu-affinity with what narrows the affinity it leaves out
add(Case("fit-no-gpu-affinity-with-family", "serve-kube", [*KUBE, "--no-gpu-affinity", "--gpu-family", "hopper", *OUT],
         files=IMAGE, expect=("--gpu-family", "--no-gpu-affinity leaves out")))
# --gpu-family against the image's device code, and the labels it is read from
for family, over in (("blackwell", {}), ("hopper", {"io.builder.package.vllm.sass": "sm_80",
                                                     "io.builder.package.flash-attn.sass": "sm_80"}),
                     ("ampere", {"io.builder.package.vllm.sass": "sm_90a", "io.builder.package.flash-attn.sass": "sm_90"}),
                     ("hopper", {"io.builder.package.vllm.sass": "sm_100f,sm_120a",
                                 "io.builder.package.flash-attn.sass": "sm_100,sm_120"})):
    add(Case(f"fit-gpu-family-{family}-not-run-by-{'-'.join(over.values()) or 'sm_80,sm_90'}".replace(",", "-"),
             "serve-kube", [*KUBE, "--gpu-family", family, *OUT], files={"i.json": image_json(**over)},
             expect=(f"--gpu-family {family}", "runs on")))
for name, value in {"word": "hopper", "sm-without-underscore": "sm90", "space": "sm_80, sm_90",
                    "newline": "sm_80\nsm_90", "upper": "SM_90", "long": "sm_" + "9" * ARG}.items():
    add(Case(f"fit-device-code-label-{name}", "serve-kube-image", [*KUBE, *OUT],
             files={"i.json": image_json(**{"io.builder.package.vllm.sass": value})},
             expect=("io.builder.package.vllm.sass",)))
add(Case("fit-binaries-label-not-json", "serve-kube-image", [*KUBE, *OUT],
         files={"i.json": image_json(**{"io.builder.package.vllm.binaries": "{nope"})},
         expect=("io.builder.package.vllm.binaries",)))
add(Case("fit-device-code-none", "serve-kube-image", [*KUBE, *OUT],
         files={"i.json": image_json(**{"io.builder.archs": None, "io.builder.package.vllm.sass": None,
                                        "io.builder.package.flash-attn.sass": None})},
         expect=("no GPU builder knows runs all of the image's device code", "no io.builder.archs label",
                 "--no-gpu-affinity")))
add(Case("fit-device-code-of-no-known-gpu", "serve-kube-image", [*KUBE, *OUT],
         files={"i.json": image_json(**{"io.builder.archs": "35", "io.builder.package.vllm.sass": "sm_35",
                                        "io.builder.package.flash-attn.sass": "sm_35"})},
         expect=("no GPU builder knows runs all of the image's device code", "io.builder.archs=35")))

# --rollout
bad("rollout", "--rollout", {"empty": "", "rolling": "rolling", "capital": "Recreate", "surge0": "surge0",
                             "type": "RollingUpdate", "newline": "recreate\n", "space": "no surge", "long": "r" * ARG,
                             "percent": "25%"}, ("--rollout", "one of recreate, no-surge, surge"))

# --runtime-class: a RuntimeClass's name, a DNS subdomain
bad("runtime-class", "--runtime-class", {"empty": "", "upper": "Nvidia", "underscore": "nvidia_cdi", "slash": "a/b",
                                         "space": "nvidia cdi", "254": "r" * 254, "leading-dash": "-nvidia",
                                         "trailing-dot": "nvidia.", "newline": "nvidia\n", "long": "r" * ARG,
                                         "yaml": "nvidia\nhostNetwork: true"}, ("--runtime-class", "not a RuntimeClass name"))

# --hub-cache: pvc:CLAIM[/PATH], and only where the engine downloads from the hub (DFlash2's drafter by hub id)
DFLASH2 = given(KUBE, "--strategy", "DFlash2")
bad("hub-cache", "--hub-cache", {"empty": "", "bare": "hf", "hostpath": "hostpath:/srv/hf", "volume": "volume:hf",
                                 "emptydir": "emptyDir", "url": "s3://bucket/hf"}, ("--hub-cache", "pvc:CLAIM"),
    base=DFLASH2)
bad("hub-cache", "--hub-cache", {"pvc-empty": "pvc:", "pvc-upper": "pvc:HF", "pvc-underscore": "pvc:hf_cache",
                                 "pvc-254": "pvc:" + "h" * 254, "pvc-long": "pvc:" + "h" * ARG},
    ("--hub-cache", "not a claim name"), base=DFLASH2)
bad("hub-cache", "--hub-cache", {"pvc-dotdot": "pvc:hf/../x", "pvc-space": "pvc:hf/a b", "pvc-newline": "pvc:hf/a\nb"},
    ("--hub-cache", "not a relative path"), base=DFLASH2)
add(Case("fit-hub-cache-nothing-downloaded-mtp2", "serve-kube", [*KUBE, "--hub-cache", "pvc:hf", *OUT], files=IMAGE,
         expect=("--hub-cache", "downloads nothing from the hub")))
add(Case("fit-hub-cache-nothing-downloaded-drafter-path", "serve-kube",
         [*DFLASH2, "--drafter", "/models/drafter", "--hub-cache", "pvc:hf", *OUT], files=IMAGE,
         expect=("--hub-cache", "downloads nothing from the hub")))

# --drain-timeout: whole seconds from 0 to 3600, on either target; the engine's own flag is --drain-timeout's alone
for base_name, base, files in (("kube", KUBE, IMAGE), ("docker", SERVE, {})):
    bad(f"drain-timeout-{base_name}", "--drain-timeout", {
        "negative": "-1", "3601": "3601", "word": "long", "float": "1.5", "empty": "", "nan": "nan", "huge": "9" * 40,
        "unit": "30s", "hex": "0x1e"}, ("--drain-timeout",), base=base, files=files)
for name, engine_args in (("separate", "--shutdown-timeout 5"), ("equals", "--shutdown-timeout=5"),
                          ("after-others", "--max-model-len 4096 --shutdown-timeout 0")):
    add(Case(f"fit-engine-args-shutdown-timeout-{name}", "serve-kube", [*KUBE, "--engine-args", engine_args, *OUT],
             files=IMAGE, expect=("--engine-args sets --shutdown-timeout", "--drain-timeout")))

# a Kubernetes option without --kubernetes: refused, not left out of the docker line without a word
for opt, value in (("--gpu-product", "NVIDIA-H200"), ("--rollout", "surge"), ("--runtime-class", "nvidia"),
                   ("--hub-cache", "pvc:hf"), ("--no-gpu-affinity", None)):
    add(Case(f"fit-kube-option-without-kubernetes{opt}", "serve-kube", [*SERVE, opt, *([] if value is None else [value])],
             expect=(opt, "a Kubernetes option")))

# good values: served, each doing what it says (exit 0, the manifests on stdout)
for name, args, says in (
        ("gpu-product", ["--gpu-product", "NVIDIA-H200"], ("nvidia.com/gpu.product", "NVIDIA-H200")),
        ("gpu-family-ada-lovelace", ["--gpu-family", "ada-lovelace"], ("nvidia.com/gpu.compute.minor", "- '9'")),
        ("no-gpu-affinity", ["--no-gpu-affinity"], ("kind: Deployment",)),
        ("rollout-surge", ["--rollout", "surge"], ("maxSurge: 1", "maxUnavailable: 0")),
        ("rollout-default", ["--replicas", "2"], ("maxSurge: 0", "maxUnavailable: 1")),
        ("runtime-class", ["--runtime-class", "nvidia"], ("runtimeClassName: nvidia",)),
        ("drain-timeout-zero", ["--drain-timeout", "0"], ("--shutdown-timeout\n        - '0'", "terminationGracePeriodSeconds: 30")),
        ("hub-cache-claim", ["--strategy", "DFlash2", "--hub-cache", "pvc:hf-cache/hub"],
         ("HF_HUB_CACHE", "claimName: hf-cache", "subPath: hub"))):
    base = given(KUBE, "--strategy", "DFlash2") if "--strategy" in args else KUBE
    extra = [a for a in args if a not in ("--strategy", "DFlash2")]
    add(Case(f"fit-fine-{name}", "fine", [*base, *extra], code=0, files=IMAGE, expect=says))

assert len({c.id for c in CASES}) == len(CASES), "duplicate case ids"
