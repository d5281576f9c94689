# Stand-in for nvidia/cuda:13.0.x-base: Debian + python3 + the CUDA runtime library only.
# libcudart.so.13 comes from the local devel image's toolkit.
ARG BASE=builder-local/debian:bookworm
ARG DEVEL=builder-local/cuda:13.0-devel
FROM ${DEVEL} AS toolkit

FROM ${BASE}
ENV DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/*

COPY --from=toolkit /usr/local/cuda/lib/libcudart.so.13 /usr/local/cuda-13.0/lib/
RUN ln -s lib /usr/local/cuda-13.0/lib64 \
 && ln -s cuda-13.0 /usr/local/cuda \
 && echo /usr/local/cuda/lib > /etc/ld.so.conf.d/cuda.conf \
 && ldconfig \
 && ldconfig -p | grep -q 'libcudart.so.13 .*/usr/local/cuda'

ENV CUDA_VERSION=13.0.0 \
    PATH=/usr/local/cuda/bin:$PATH \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
