"""The CUDA-box sgl_kernel stand-in: fake registrations of missing sgl_kernel ops are skipped,
others are not."""

import subprocess
import sys


CODE = r"""
import torch
from sglab.sglang.bootstrap import _skip_fakes_of_missing_sgl_kernel_ops
_skip_fakes_of_missing_sgl_kernel_ops()

@torch.library.register_fake("sgl_kernel::moe_fused_gate")
def fake(x):
    return x

assert fake(3) == 3                                   # the decorator hands the function back
assert not hasattr(torch.ops.sgl_kernel, "moe_fused_gate")   # the op is still not there
lib = torch.library.Library("sglab_shim_test", "DEF")
lib.define("twice(Tensor x) -> Tensor")
seen = []

@torch.library.register_fake("sglab_shim_test::twice")
def twice_fake(x):
    seen.append(1)
    return torch.empty_like(x)

out = torch.ops.sglab_shim_test.twice(torch.empty(3, device="meta"))
assert seen == [1] and out.shape == (3,)              # other namespaces still register for real
print("ok")
"""


def test_fakes_of_missing_sgl_kernel_ops_are_skipped_and_others_kept():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
