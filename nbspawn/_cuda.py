"""CUDA on this machine: the facts nbspawn decides from, gathered without touching CUDA, and the
decisions themselves, as pure functions of those facts (so they are tested with facts passed in).

What torch 2.13 does, and why the facts are these (``torch/cuda/__init__.py``,
``torch/csrc/cuda/Module.cpp``):

* ``torch.cuda.is_available()`` runs ``torch._C._cuda_getDeviceCount()`` (``cudaGetDeviceCount``,
  which runs ``cuInit``) unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1``; ``_cuda_getDeviceCount`` and
  ``_cuda_getArchFlags`` (``get_arch_list()``) call ``poison_fork()``, which registers a
  ``pthread_atfork`` child handler that marks every later forked child "in bad fork".  Neither sets
  ``torch.cuda._initialized``, and ``_is_in_bad_fork()`` is False in the kernel itself: only a
  forked child can tell.  ``device_count()`` asks NVML first, but falls back on
  ``_cuda_getDeviceCount`` (poisoning fork) when NVML fails or ``CUDA_VISIBLE_DEVICES`` names MIG
  devices.
* Another library (CuPy, JAX, Numba) may have run ``cuInit`` itself: the driver is then initialized
  in the kernel, and a forked child's ``cuInit`` fails, whatever torch thinks.
* ``cuInit`` needs ``libcuda.so`` mapped; every driver call but ``cuInit``/``cuDriverGetVersion``
  answers ``CUDA_ERROR_NOT_INITIALIZED`` (3) until ``cuInit`` ran, without initializing anything.

So "could a forked rank use CUDA" is asked of: torch's own state, a forked probe child (torch's
flag), and the driver library (loaded at all, then initialized or not).  Counting GPUs never asks
the CUDA runtime in the kernel: NVML's raw count (``CUDA_VISIBLE_DEVICES`` ignored), or
``/proc/driver/nvidia/gpus``, with the ranks' own ``CUDA_VISIBLE_DEVICES`` applied here.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, cast

from .errors import SpawnUsageError

CUDA_ERROR_NOT_INITIALIZED = 3
VISIBLE = "CUDA_VISIBLE_DEVICES"
ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"

# -- pure decisions -------------------------------------------------------------------------------


def visible_devices(value: str | None) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as the CUDA runtime reads it (torch's ``_parse_visible_devices``):
    None when unset (every GPU); ordinals stop at the first one that is not a number (``-1`` hides
    everything after it); ``GPU-``/``MIG-`` UUID lists stop at the first entry of another kind; a
    repeated entry makes the list empty."""
    if value is None:
        return None
    items = [item.strip() for item in value.split(",")]
    found: list[str] = []
    for prefix in ("GPU-", "MIG-"):
        if value.strip().startswith(prefix):
            for item in items:
                if item in found:
                    return []
                if not item.startswith(prefix):
                    break
                found.append(item)
            return found
    for item in items:
        digits = ""
        for index, char in enumerate(item):
            if char.isdigit() or (index == 0 and char in "+-"):
                digits += char
            else:
                break
        try:
            number = int(digits)
        except ValueError:
            break
        if number < 0:
            break
        if str(number) in found:
            return []
        found.append(str(number))
    return found


def count_visible(value: str | None, physical: int) -> int:
    """How many GPUs a process with ``CUDA_VISIBLE_DEVICES=value`` sees on a machine with ``physical``."""
    devices = visible_devices(value)
    if devices is None:
        return physical
    if devices and devices[0].startswith("MIG-"):
        return len(devices)  # one GPU can hold several MIG devices
    if devices and devices[0].startswith("GPU-"):
        return min(len(devices), physical)
    for index, ordinal in enumerate(devices):
        if int(ordinal) >= physical:  # the runtime stops at the first ordinal that does not exist
            return index
    return len(devices)


def same_devices(kernel_value: str | None, ranks_value: str | None) -> bool:
    """Whether the kernel and its ranks number the GPUs alike (CUDA IPC handles carry device numbers)."""
    return visible_devices(kernel_value) == visible_devices(ranks_value)


def ranks_visible(user_env: Mapping[str, str], environ: Mapping[str, str]) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` the ranks will have: the user's ``--env``, else the kernel's."""
    return user_env.get(VISIBLE, environ.get(VISIBLE))


@dataclass(frozen=True)
class ForkFacts:
    """What decides whether a forked rank could use CUDA."""

    gpus: int  # GPUs the ranks would see
    torch_initialized: bool = False  # torch.cuda.is_initialized() (or this process is itself a bad fork)
    torch_poisoned: bool = False  # torch's at-fork handler is registered: a forked child is "in bad fork"
    driver_initialized: bool | None = False  # cuInit ran here (None: libcuda is loaded, and could not be asked)
    culprit: str = ""  # the kernel cell line after which CUDA was first found touched (note_cell), if known


def fork_blocker(facts: ForkFacts) -> str | None:
    """Why forked ranks could not use the GPUs, in nbspawn's words; None if they could (or there are none)."""
    at = f" (first at {facts.culprit})" if facts.culprit else ""
    if facts.torch_initialized:
        return f"CUDA is already initialized in this kernel{at}"
    if facts.gpus <= 0:
        return None
    if facts.torch_poisoned and facts.driver_initialized is False:
        # the one poisoning call that does not run cuInit (Module.cpp: _cuda_getArchFlags)
        return (
            "torch.cuda.get_arch_list() ran in this kernel: it registers torch's at-fork handler, after which "
            "forked processes cannot use CUDA"
        )
    if facts.torch_poisoned:
        return (
            f"torch.cuda.is_available() (or device_count() where NVML cannot answer) ran in this kernel{at}: it "
            "initializes the CUDA driver (cudaGetDeviceCount runs cuInit), after which forked processes cannot use CUDA"
        )
    if facts.driver_initialized:
        return f"the CUDA driver is initialized in this kernel (by a library such as CuPy, JAX or Numba){at}"
    if facts.driver_initialized is None:
        return "the CUDA driver is loaded in this kernel and nbspawn cannot tell whether it was initialized"
    return None


# a line that touches CUDA (the calls that initialize the driver or poison fork, CUDA tensors, other libraries)
_TOUCHES_CUDA = re.compile(
    r"is_available\s*\(|device_count\s*\(|get_arch_list\s*\(|\.cuda\s*\(|[\"']cuda[\"':]|\bcupy\b|\bjax\b|\bnumba\b"
)


def culprit_line(label: str, source: str) -> str:
    """Where in a cell CUDA was most likely touched: ``Cell In[3], line 2: if torch.cuda.is_available():``
    (its first line that calls one of the culprits), else the cell alone (``Cell In[3]``)."""
    for number, line in enumerate(source.splitlines(), 1):
        code = line.strip()
        if code and not code.startswith("#") and _TOUCHES_CUDA.search(code):
            return f"{label}, line {number}: {code}"
    return label


def decide_start_method(requested: str, available: list[str], blocker: str | None) -> tuple[str, list[str]]:
    """Fork where forked ranks could use everything the machine has, else forkserver (with a note);
    an explicit fork that could not use the GPUs is refused, with the way out."""
    notes: list[str] = []
    if requested == "auto":
        if "fork" not in available:
            return "spawn", notes
        if blocker:
            notes.append(
                f"nbspawn: this run uses --start-method forkserver, not fork: {blocker}, so forked ranks could "
                "not use the GPUs. Pass --start-method to choose."
            )
            return "forkserver", notes
        return "fork", notes
    if requested not in available:
        raise SpawnUsageError(f"--start-method {requested} is not available on this platform ({', '.join(available)} are)")
    if requested == "fork" and blocker:
        raise SpawnUsageError(
            f"cannot fork: {blocker}, and forked ranks could not use the GPUs. Use --start-method forkserver "
            "(or spawn), or restart the kernel and run %%spawn before touching CUDA in the kernel "
            "(PYTORCH_NVML_BASED_CUDA_CHECK=1 makes torch.cuda.is_available() leave fork usable)."
        )
    return requested, notes


def resolve_backend(name: str, nprocs: int, gpus: int, where: str = "visible") -> tuple[str, str | None]:
    """The process group's backend (none | gloo | nccl) and a note if ``auto`` passed over the GPUs.

    nccl needs a GPU of its own per rank of a node (cuda:LOCAL_RANK): ``auto`` picks it only then.
    The one rule, for this machine and for a cluster: there ``nprocs`` is the ranks of each node and
    ``gpus`` the fewest any node has, ``where`` naming that node ("on node 1 (b)").
    """
    if name in ("none", "gloo"):
        return name, None
    if name == "auto":
        if gpus and nprocs <= gpus:
            return "nccl", None
        if gpus:
            return "gloo", (
                f"nbspawn: --backend auto uses gloo: {nprocs} ranks and {gpus} GPU{'s' if gpus > 1 else ''} {where} "
                "(nccl needs a GPU of its own per rank)."
            )
        return "gloo", None
    if name == "nccl":
        if not gpus:
            raise SpawnUsageError(f"--backend nccl needs CUDA GPUs and none is {where}; use --backend gloo")
        if nprocs > gpus:
            raise SpawnUsageError(f"--backend nccl needs one GPU per rank: {nprocs} ranks, {gpus} GPUs {where}")
    return name, None


def rank_device(local_rank: int, gpus: int) -> int | None:
    """The one rank -> device mapping: cuda:LOCAL_RANK (torchrun's), wrapped round where ranks
    outnumber GPUs (gloo only: nccl is refused then); None without GPUs."""
    if gpus <= 0:
        return None
    return local_rank % gpus


def torchrun_env(user_env: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """What torchrun's agent adds to a rank's environment for NCCL, unless the user set it."""
    if ASYNC_ERROR_HANDLING in user_env or ASYNC_ERROR_HANDLING in environ:
        return {}
    return {ASYNC_ERROR_HANDLING: "1"}


DUMP_FILE = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")  # torch reads the first one set


def dump_file_keys(user_env: Mapping[str, str], environ: Mapping[str, str], *, renamed: bool) -> tuple[str, ...]:
    """Which variables say where NCCL's watchdog dumps its flight recorder when a collective times out
    (each rank's own directory, + the global rank; on by default, ``TORCH_NCCL_DUMP_ON_TIMEOUT``): none
    where the user named a place.  torch's default, ``/tmp/nccl_trace_rank_<rank>`` (``~/.cache/torch/``
    in newer torch), is one file per rank number for every run and kernel of the machine.  ``renamed``:
    the ranks' torch has the generic FlightRecorder (:func:`recorder_renamed`)."""
    if any(key in user_env or key in environ for key in DUMP_FILE):
        return ()
    # only the name this torch reads: the old one on a torch from after the rename warns in every rank
    return DUMP_FILE[:1] if renamed else DUMP_FILE


def recorder_renamed() -> bool:
    """Whether the torch imported in this process has the generic FlightRecorder (its
    ``_dump_fr_trace_json``): it came with the rename to ``TORCH_FR_*`` variables, after which torch
    warns on every rank of an old name that is set.  A process that has not imported torch says no:
    both names, the safe side for settings that must reach torch."""
    torch_c = getattr(sys.modules.get("torch"), "_C", None)
    c10d = getattr(torch_c, "_distributed_c10d", None)
    return c10d is not None and hasattr(c10d, "_dump_fr_trace_json")


def socket_interface_env(interface: str | None, user_env: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """GLOO/NCCL_SOCKET_IFNAME for the interface a node reaches node 0 through, unless the user set them.

    NCCL reads its value as a prefix (``eth1`` also matches ``eth10``); ``=eth1`` is the exact name.
    Gloo takes the exact name as it is.
    """
    if not interface:
        return {}
    wanted = {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": f"={interface}"}
    return {key: value for key, value in wanted.items() if key not in user_env and key not in environ}


def node_gpus(engine_visible: list[str | None], physical: int) -> tuple[int, str | None]:
    """A node's GPUs from what every engine on it sees, and the ``CUDA_VISIBLE_DEVICES`` its ranks need.

    A scheduler (Slurm) may bind one GPU per engine with ``CUDA_VISIBLE_DEVICES``: the node's ranks
    get the union of the engines' devices.  An engine without the variable sees every GPU.
    """
    if not engine_visible or any(value is None for value in engine_visible):
        return physical, None
    union: list[str] = []
    for value in engine_visible:
        for device in visible_devices(value) or []:
            if device not in union:
                union.append(device)
    joined = ",".join(union)
    return count_visible(joined, physical) if union else 0, joined


# -- facts of this process ------------------------------------------------------------------------


def _torch() -> ModuleType | None:
    return sys.modules.get("torch")


def compiled_with_cuda(torch: ModuleType | None = None) -> bool:
    torch = torch or _torch()
    return torch is not None and hasattr(torch._C, "_cuda_getDeviceCount")


def physical_gpus() -> int | None:
    """The machine's GPUs (``CUDA_VISIBLE_DEVICES`` ignored), asked without the CUDA runtime: NVML,
    else the NVIDIA driver's ``/proc`` entries; 0 without an NVIDIA driver (a CUDA build of torch on
    a CPU machine); None when the driver is there but neither can say."""
    torch = _torch()
    raw = getattr(getattr(torch, "cuda", None), "_raw_device_count_nvml", None)
    if raw is not None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                count = int(raw())
        except (OSError, AttributeError):
            count = -1
        if count >= 0:
            return count
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except FileNotFoundError:
        return None if os.path.isdir("/proc/driver/nvidia") else 0
    except OSError:
        return None


_child_counts: dict[str | None, int] = {}


def _count_in_child(visible: str | None) -> int:
    """The last resort (no NVML, no /proc entries): a child process asks the CUDA runtime."""
    if visible not in _child_counts:
        env = dict(os.environ)
        env.pop(VISIBLE, None)
        if visible is not None:
            env[VISIBLE] = visible
        try:
            done = subprocess.run(
                [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                env=env, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            _child_counts[visible] = int(done.stdout.strip().splitlines()[-1])
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            _child_counts[visible] = 0
    return _child_counts[visible]


def gpu_count(visible: str | None, torch: ModuleType | None = None) -> int:
    """GPUs that ranks with ``CUDA_VISIBLE_DEVICES=visible`` see; never poisons this process's fork.
    ``torch``: the module to ask (this process's)."""
    if torch is None:
        import torch as imported

        torch = imported
    if not compiled_with_cuda(torch):
        return 0
    if torch.cuda._initialized:
        note_initialized()
    if (torch.cuda._initialized and visible == kernel_visible()) or torch.version.hip:
        # asked already, and counted under this very CUDA_VISIBLE_DEVICES (torch keeps the count it had at
        # its initialization): nothing left to poison (ROCm: torch asks amdsmi, as it always did)
        return int(torch.cuda.device_count())
    physical = physical_gpus()
    if physical is None:
        return _count_in_child(visible)
    return count_visible(visible, physical)


_libcuda_at: list[Any] = [None, -1.0]  # the driver's path once mapped (it stays); else when it was last looked for
LIBCUDA_RECHECK = 1.0  # seconds an answer "not mapped" is trusted: one look per payload, not one per tensor


def _libcuda() -> str | None:
    """The path of the CUDA driver library if this process has it mapped.  Read from /proc/self/maps
    once it is (a library stays mapped), and at most once per :data:`LIBCUDA_RECHECK` before: a payload
    asks for each of its CPU storages (a 1,000-tensor model for 8 ranks: 8,000 reads; the fourth GPU
    review's N-m5)."""
    path, looked = _libcuda_at
    if path is not None or time.monotonic() - looked < LIBCUDA_RECHECK:
        return cast("str | None", path)
    path = None
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                if "libcuda.so" in line:
                    path = line.split(None, 5)[-1].strip()
                    break
    except OSError:
        pass
    _libcuda_at[:] = [path, time.monotonic()]
    return path


def driver_initialized() -> bool | None:
    """Whether ``cuInit`` ran in this process: False when libcuda is not even loaded; asked of the
    loaded library otherwise (``cuDeviceGetCount`` answers NOT_INITIALIZED before ``cuInit``)."""
    path = _libcuda()
    if path is None:
        return False
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)  # already loaded: nothing runs
        count = ctypes.c_int(0)
        rc = lib.cuDeviceGetCount(ctypes.byref(count))
    except (OSError, AttributeError):
        return None
    return rc != CUDA_ERROR_NOT_INITIALIZED


_poisoned = False  # once torch registered its at-fork handler it stays registered
_clean_since_cell = False  # a probe found fork clean, and no kernel cell has run since (note_cell)


def torch_poisoned_fork() -> bool:
    """Whether a child forked now would be "in bad fork" for torch: asked of a forked child, once
    between two kernel cells: only the kernel's own code (a cell) can register torch's at-fork handler,
    and forking a large kernel costs (its page tables; every library's at-fork hooks)."""
    global _poisoned, _clean_since_cell
    torch = _torch()
    if _poisoned or _clean_since_cell or torch is None or not compiled_with_cuda(torch):
        return _poisoned
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Python 3.12+: fork with threads
        pid = os.fork()
    if pid == 0:  # the child reads one flag and leaves, touching nothing else
        try:
            bad = bool(torch._C._cuda_isInBadFork())
        except BaseException:
            bad = True
        os._exit(1 if bad else 0)
    _, status = os.waitpid(pid, 0)
    _poisoned = os.waitstatus_to_exitcode(status) != 0
    _clean_since_cell = not _poisoned
    return _poisoned


def fork_facts(gpus: int) -> ForkFacts:
    """This kernel's facts (the costlier ones asked only where the cheaper did not already say no).

    torch's fork probe is asked even when the driver is initialized: ``torch.cuda.is_available()``
    runs ``cuInit`` itself (``cudaGetDeviceCount``), so an initialized driver is most often torch's
    own doing, and the culprit to name is torch's call, not "a library such as CuPy"."""
    torch = _torch()
    if torch is None:
        return ForkFacts(gpus=gpus)
    if torch.cuda.is_initialized() or torch.cuda._is_in_bad_fork():
        note_initialized()
        return ForkFacts(gpus=gpus, torch_initialized=True, culprit=_culprit or "")
    if gpus <= 0 or not compiled_with_cuda(torch):
        return ForkFacts(gpus=gpus)
    return ForkFacts(
        gpus=gpus, torch_poisoned=torch_poisoned_fork(), driver_initialized=driver_initialized(), culprit=_culprit or ""
    )


_culprit: str | None = None  # culprit_line of the first kernel cell after which CUDA was found touched
_visible_at_init: list[str | None] = []  # CUDA_VISIBLE_DEVICES when torch's CUDA was first found initialized


def note_initialized() -> None:
    """torch's CUDA is initialized in this kernel: the ``CUDA_VISIBLE_DEVICES`` it numbers its GPUs by
    is remembered, the first time (the runtime reads it once, at its initialization)."""
    if not _visible_at_init:
        _visible_at_init.append(os.environ.get(VISIBLE))


def kernel_visible() -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` this kernel's CUDA numbers the GPUs by (a CUDA IPC handle carries
    that number): the value it had when CUDA was first found initialized here, else the current one.
    A notebook that changes it afterwards changes it for new processes (the ranks), not for the kernel."""
    return _visible_at_init[0] if _visible_at_init else os.environ.get(VISIBLE)


def note_cell(label: str, source: str) -> None:
    """After each of the kernel's own cells (IPython's post_run_cell): the first cell after which CUDA is
    touched in this kernel (the driver initialized: ``torch.cuda.is_available()``, a CUDA tensor, CuPy)
    is remembered with its likeliest line, so that a refusal to fork names it.  Costs nothing on a CPU
    build, before torch is imported and once found; else a read of ``/proc/self/maps`` (about 1 ms).
    ``get_arch_list()`` initializes nothing, so it is named by the call alone.  A cell of the user's
    own code may also have poisoned fork: the next plan asks the probe again (:func:`torch_poisoned_fork`);
    a ``%%spawn`` cell runs its code in the ranks, and leaves that answer as it was."""
    global _culprit, _clean_since_cell
    if not source.lstrip().startswith("%%spawn"):
        _clean_since_cell = False
    torch = _torch()
    if torch is None or not compiled_with_cuda(torch):
        return
    if torch.cuda.is_initialized():
        note_initialized()
    if _culprit is not None:
        return
    if torch.cuda.is_initialized() or driver_initialized() is not False:
        _culprit = culprit_line(label, source)


def may_hold_pinned() -> bool:
    """Whether this process can hold pinned (page-locked) memory: only once CUDA is initialized in it
    (by torch, or the driver by another library); never on a build without CUDA.  Asking torch before
    then would initialize CUDA on torch < 2.7 (``CUDAHooks::isPinnedPtr``: ``cudaGetDeviceCount``, then
    a context on GPU 0), in a kernel that may fork its ranks next."""
    torch = _torch()
    if torch is None or not compiled_with_cuda(torch):
        return False
    if torch.cuda.is_initialized():
        return True
    if driver_initialized() is False:
        return False
    if _release(torch.__version__) >= (2, 7):
        return True
    # torch < 2.7 asks cudaPointerGetAttributes, which makes a context on GPU 0 unless the process has one
    # somewhere: a kernel that only asked torch.cuda.is_available() has the driver but none (N-m4)
    try:
        return any(torch._C._cuda_hasPrimaryContext(i) for i in range(torch.cuda.device_count()))
    except Exception:
        return False


def _release(version: str) -> tuple[int, ...]:
    """``"2.6.0+cu124"`` -> (2, 6): what a torch version is, for comparing."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def collect_ipc() -> None:
    """In the kernel: free GPU memory the ranks released since (``torch.cuda.ipc_collect``)."""
    torch = _torch()
    if torch is not None and compiled_with_cuda(torch) and torch.cuda.is_initialized():
        try:
            torch.cuda.ipc_collect()
        except RuntimeError:
            pass
