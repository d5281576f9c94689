"""The first call of FlashInfer's FP8 block-scale GEMM (fp8_blockscale_gemm_sm90: what vLLM's block-FP8 linear layers
call for M < 32 on compute capability 9.0), on a GPU host: with an empty FlashInfer workspace the call JIT-builds the
module (FlashInfer's own generator, nvcc, the -lnvrtc -lcuda link); `prebuild` runs the generator and its build method
alone, as `jit = "prebuilt"` does at image-build time; a run against that workspace then only loads it. Each run checks
the result against the dequantized weights (128x128 blocks, as the Qwen FP8 checkpoints have them).

    FLASHINFER_CUDA_ARCH_LIST=9.0 FLASHINFER_WORKSPACE_BASE=$(mktemp -d) python benchmarks/flashinfer_first_call.py run
    W=$(mktemp -d); FLASHINFER_CUDA_ARCH_LIST=9.0 FLASHINFER_WORKSPACE_BASE=$W python benchmarks/flashinfer_first_call.py prebuild
    FLASHINFER_WORKSPACE_BASE=$W python benchmarks/flashinfer_first_call.py run
"""
import os, sys, time, json
t0 = time.monotonic()
import torch
from flashinfer.jit.gemm.fp8_blockscale import gen_fp8_blockscale_gemm_sm90_module
mode = sys.argv[1]
if mode == "prebuild":
    spec = gen_fp8_blockscale_gemm_sm90_module(); spec.build(False)
    print(json.dumps({"mode": mode, "seconds": round(time.monotonic() - t0, 1), "lib": str(spec.jit_library_path), "bytes": os.path.getsize(spec.jit_library_path)})); sys.exit(0)
from flashinfer.gemm import fp8_blockscale_gemm_sm90
torch.manual_seed(0)
N, K = 512, 256
w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
# 128x128 block scales as in the Qwen FP8 checkpoints
ws = (w.view(N // 128, 128, K // 128, 128).abs().amax(dim=(1, 3)) / 448.0).float()
wq = (w.view(N // 128, 128, K // 128, 128) / ws[:, None, :, None]).view(N, K).to(torch.float8_e4m3fn)
wd = (wq.float().view(N // 128, 128, K // 128, 128) * ws[:, None, :, None]).view(N, K)
t1 = time.monotonic()
worst = 0.0
for M in (1, 2, 4, 8, 16):
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    y = fp8_blockscale_gemm_sm90(x, wq, None, ws)
    ref = x.float() @ wd.T
    worst = max(worst, ((y.float() - ref).abs().max() / ref.abs().max()).item())
torch.cuda.synchronize()
print(json.dumps({"mode": mode, "first_call_s": round(time.monotonic() - t1, 1), "total_s": round(time.monotonic() - t0, 1), "max_rel_err": round(worst, 4), "out": str(y.dtype)}))
