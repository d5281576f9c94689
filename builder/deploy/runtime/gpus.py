"""This host's NVIDIA GPUs, read once from nvidia-smi into typed records: what smoke, bench, `doctor` and
`doctor --host` know of them (index, name, driver, compute capability, product brand, and the SM count the CUDA
driver reports), and the memory bench samples while an engine runs."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from dataclasses import dataclass, replace

from ... import archs as archs_mod
from ... import redact, schema
from ...errors import EnvironmentProblem, UserError

QUERY = ("--query-gpu=index,name,driver_version,compute_cap", "--format=csv,noheader")
BUS_QUERY = ("--query-gpu=index,pci.bus_id", "--format=csv,noheader")
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16  # cuda.h CUdevice_attribute


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    driver: str
    compute_cap: int  # 90 = 9.0
    brand: str  # nvidia-smi's "Product Brand": NVIDIA, Tesla, GeForce, Quadro, ...
    # streaming multiprocessors, as the CUDA driver reports them (cuDeviceGetAttribute): DeepGEMM compiles its kernels
    # for this count (a template argument), so a warm layer's DeepGEMM cache fits only GPUs with the same count.
    # None: not read (no libcuda here, a GPU record that does not say)
    sm_count: int | None = None

    @classmethod
    def from_json(cls, data: dict, index: int = 0, where: str = "GPU record") -> "Gpu":
        """A GPU record ({"name", "driver", "compute_cap", "brand", "index"}: a --gpus-file entry, `--json`'s own
        output, a line of nvidia-smi) checked by its shape (schema.GPU_RECORD)."""
        schema.check(where, data, schema.GPU_RECORD)
        cc = data["compute_cap"]
        cc = cc if isinstance(cc, int) else archs_mod.parse(str(cc), "compute_cap")[0]
        return cls(data.get("index", index), data["name"], data["driver"], cc, data.get("brand", ""),
                   data.get("sm_count"))


@dataclass(frozen=True)
class HostGpus:
    """What nvidia-smi said: the GPUs, or why there are none. `failed`: nvidia-smi is there but does not work
    (`error` is its first words); a host without nvidia-smi has no GPU and nothing failed."""

    gpus: tuple[Gpu, ...]
    why_none: str = ""
    failed: bool = False
    error: str = ""

    @property
    def present(self) -> bool:
        return bool(self.gpus)

    @property
    def arch(self) -> int | None:
        """GPU 0's compute capability (90 = 9.0)."""
        return self.gpus[0].compute_cap if self.gpus else None

    def chosen(self, ids: tuple[int, ...] = ()) -> Gpu | None:
        """The GPU an engine runs on: the first of `ids` (--gpus IDS), else GPU 0; None without one. A warm layer's
        key is judged against it."""
        if not self.gpus:
            return None
        return next((g for g in self.gpus if g.index == ids[0]), self.gpus[0]) if ids else self.gpus[0]

    def describe(self) -> dict:
        """{"gpu": "2 x NVIDIA H200", "driver": "580.159.04"} for a bench result; gpu "none" without any."""
        if not self.gpus:
            return {"gpu": "none", "driver": None}
        names = sorted({g.name for g in self.gpus})
        return {"gpu": f"{len(self.gpus)} x {', '.join(names)}", "driver": self.gpus[0].driver}


def parse_nvidia_smi(csv_text: str, q_text: str = "") -> list[Gpu]:
    """`nvidia-smi --query-gpu=index,name,driver_version,compute_cap --format=csv,noheader` and the "Product
    Brand" lines of `nvidia-smi -q` (one per GPU, in the same order). A line that does not read as a GPU is an
    EnvironmentProblem naming it (nvidia-smi is the host's: exit 3), never a GPU left out in silence."""
    brands = re.findall(r"^\s*Product Brand\s*:\s*(.*?)\s*$", q_text, re.M)
    lines = [ln for ln in csv_text.splitlines() if ln.strip()]
    gpus = []
    for i, line in enumerate(lines):
        fields = [f.strip() for f in line.split(",")]
        where = f"nvidia-smi's GPU line {i + 1} ({redact.describe(line)})"
        if len(fields) != 4 or not re.fullmatch(r"[0-9]{1,3}", fields[0]):
            raise EnvironmentProblem(f"{where}: expected 'index, name, driver_version, compute_cap'")
        try:
            gpus.append(Gpu.from_json({"index": int(fields[0]), "name": fields[1], "driver": fields[2],
                                       "compute_cap": fields[3], "brand": brands[i] if i < len(brands) else ""}, i,
                                      where))
        except UserError as exc:
            raise EnvironmentProblem(str(exc)) from None
    if len({g.index for g in gpus}) != len(gpus):
        raise EnvironmentProblem(f"nvidia-smi lists a GPU index twice: {', '.join(str(g.index) for g in gpus)}")
    return gpus


def nvidia_smi(*args: str, timeout: float = 60) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of nvidia-smi; bytes that are no UTF-8 are replaced, not a traceback. A host
    without it starts no process."""
    if shutil.which("nvidia-smi") is None:
        return 127, "", "nvidia-smi: not found"
    try:
        proc = subprocess.run(["nvidia-smi", *args], capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return 127, "", "nvidia-smi: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"nvidia-smi timed out after {timeout:g}s"
    except OSError as exc:
        return 126, "", f"nvidia-smi: {exc.strerror or exc}"
    return proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")


def read() -> HostGpus:
    """This host's GPUs (a verb reads them once and passes the value on). A line nvidia-smi prints that is no
    GPU raises EnvironmentProblem (exit 3)."""
    code, out, err = nvidia_smi(*QUERY)
    if code == 127:
        return HostGpus((), "this host has no NVIDIA GPU (nvidia-smi not found)")
    if code != 0:
        said = (err or out).strip()
        return HostGpus((), f"nvidia-smi fails (exit {code}): {redact.describe(said[:200])}", failed=True,
                        error=said.splitlines()[0] if said else f"exit {code}")
    _, q, _ = nvidia_smi("-q")
    gpus = parse_nvidia_smi(out, q)
    if gpus:
        _, buses, _ = nvidia_smi(*BUS_QUERY)
        counts = sm_counts(dict(line.split(", ", 1) for line in buses.splitlines() if ", " in line))
        gpus = [replace(g, sm_count=counts.get(str(g.index))) for g in gpus]
    return HostGpus(tuple(gpus), "" if gpus else "nvidia-smi lists no GPU")


def sm_counts(bus_ids: dict[str, str], lib: str = "libcuda.so.1") -> dict[str, int]:
    """{nvidia-smi index: SM count} read from the CUDA driver itself (cuInit, cuDeviceGetByPCIBusId,
    cuDeviceGetAttribute MULTIPROCESSOR_COUNT), each GPU found by its PCI bus id: CUDA's own device order need not
    be nvidia-smi's. {} where the driver library does not load or does not answer (a GPU whose count is not read is
    judged as unknown, never guessed from its name)."""
    try:
        cuda = ctypes.CDLL(lib)
        if cuda.cuInit(0) != 0:
            return {}
    except (OSError, AttributeError):
        return {}
    out = {}
    for index, bus in bus_ids.items():
        dev, count = ctypes.c_int(), ctypes.c_int()
        bus = bus.strip()
        # nvidia-smi writes an 8-digit PCI domain (00000000:18:00.0), CUDA its own 4-digit one: either is tried
        tries = [bus, bus[4:]] if re.fullmatch(r"0000[0-9A-Fa-f]{4}:.*", bus) else [bus]
        if (any(cuda.cuDeviceGetByPCIBusId(ctypes.byref(dev), t.encode()) == 0 for t in tries) and
                cuda.cuDeviceGetAttribute(ctypes.byref(count), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) == 0
                and count.value > 0):
            out[index.strip()] = count.value
    return out


def memory_used() -> list[int] | None:
    """MiB in use on every GPU now (bench samples it through a run); None when nvidia-smi does not answer."""
    code, out, _ = nvidia_smi("--query-gpu=memory.used", "--format=csv,noheader,nounits", timeout=10)
    if code != 0:
        return None
    try:
        return [int(float(x)) for x in out.split()]
    except ValueError:
        return None
