"""The toy's pinned CPU numerics (bfspo/toy/numerics.py, issue 36): the settings, and that they take
effect in a process that sets them before it loads torch, whatever its environment said.
tests/test_workflow.py checks that the toy's rules set them; tests/test_toy_sft.py, that `bfspo toy
build` does and records them."""

from __future__ import annotations

import os
import subprocess
import sys

from bfspo.toy import numerics

# MKL's named constants for its CNR branch (oneMKL Developer Reference, "Named Constants for CNR Control")
MKL_CBWR_COMPATIBLE = 3

PROBE = """
import ctypes, os
from bfspo.toy import numerics
print(numerics.pin())
import torch
torch.ones(8, 8) @ torch.ones(8, 8)  # MKL reads MKL_CBWR when it starts
lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
print(torch.backends.cpu.get_cpu_capability())
print(lib.mkl_serv_cbwr_get(1) if hasattr(lib, "mkl_serv_cbwr_get") else "absent")
"""


def test_the_settings_are_torchs_avx2_kernels_mkls_cross_vendor_branch_and_onednns_avx2_cap():
    assert numerics.PINNED == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert numerics.shell_prefix() == "env ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=AVX2 "


def test_pinning_before_torch_loads_takes_effect_over_the_environments_settings():
    """torch's dispatch reports AVX2 and torch's own MKL reports its COMPATIBLE branch, although the
    environment asked for AVX-512 and MKL's AVX2 branch."""
    env = os.environ | {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    pinned, capability, branch = out.stdout.split()[-3:]
    assert pinned == "True"
    if "avx2" in open("/proc/cpuinfo").read():
        assert capability == "AVX2"
    assert branch in (str(MKL_CBWR_COMPATIBLE), "absent")  # absent: a torch build without MKL's service functions


def test_a_process_that_loaded_torch_is_left_alone():
    import torch  # noqa: F401 (loaded: its dispatch may have read the environment already)

    environ = {"ATEN_CPU_CAPABILITY": "avx512"}
    assert numerics.pin(environ) is False and environ == {"ATEN_CPU_CAPABILITY": "avx512"}
    assert numerics.pin(dict(numerics.PINNED)) is True  # started under them: they are in force
    assert numerics.describe({}) == "ATEN_CPU_CAPABILITY=unset MKL_CBWR=unset ONEDNN_MAX_CPU_ISA=unset"
