# Stand-in for nvidia/cuda:13.0.x-devel, built from PyPI wheels on a local Debian base.
# Layout as in the NVIDIA images: /usr/local/cuda -> /usr/local/cuda-13.0 (here a link to the
# wheels' toolkit root site-packages/nvidia/cu13: bin/nvcc, include/, lib/ with lib64 -> lib).
# Build with the host's CA bundle as a secret (never copied into a layer):
#   docker buildx build --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt --load \
#     -t builder-local/cuda:13.0-devel -f cuda-devel.Dockerfile .
ARG BASE=builder-local/debian:bookworm
FROM ${BASE}

ENV DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-venv python3-dev build-essential ca-certificates git \
 && rm -rf /var/lib/apt/lists/*

# Matching CUDA 13.0 pieces; nvidia-nvvm must stay pinned (a newer NVVM emits PTX that the
# 13.0 ptxas rejects).
ARG CUDA_TOOLKIT_VENV=/opt/cuda-toolkit
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && python3 -m venv "${CUDA_TOOLKIT_VENV}" \
 && "${CUDA_TOOLKIT_VENV}/bin/pip" install --no-cache-dir --disable-pip-version-check \
      nvidia-cuda-nvcc==13.0.88 \
      nvidia-cuda-crt==13.0.88 \
      nvidia-nvvm==13.0.88 \
      nvidia-cuda-cccl==13.0.85 \
      nvidia-cuda-runtime==13.0.96 \
 && root="$("${CUDA_TOOLKIT_VENV}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/cu13" \
 && test -x "${root}/bin/nvcc" \
 && ln -s libcudart.so.13 "${root}/lib/libcudart.so" \
 && ln -s lib "${root}/lib64" \
 && ln -s "${root}" /usr/local/cuda-13.0 \
 && ln -s cuda-13.0 /usr/local/cuda \
 && echo /usr/local/cuda/lib > /etc/ld.so.conf.d/cuda.conf \
 && ldconfig

ENV CUDA_HOME=/usr/local/cuda \
    CUDA_VERSION=13.0.0 \
    PATH=/usr/local/cuda/bin:$PATH \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# The toolchain must work: nvcc runs and builds sm_90 device code linked to the shared cudart.
RUN nvcc --version \
 && printf '__global__ void k(int *p) { p[threadIdx.x] = threadIdx.x; }\nint main() { return 0; }\n' > /tmp/t.cu \
 && nvcc -gencode arch=compute_90,code=sm_90 -cudart shared -o /tmp/t /tmp/t.cu \
 && ldd /tmp/t | grep -q 'libcudart.so.13 => /usr/local/cuda' \
 && rm -f /tmp/t /tmp/t.cu
