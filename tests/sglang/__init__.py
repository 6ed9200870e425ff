"""Shared pieces of the release-system tests."""

# the smallest stub with the interface of SGLang's sglang/_triton_stub.py (install(), _StubBase,
# _make_mock)
TRITON_STUB = '''
import sys, types
class _StubBase:
    pass
def _make_mock(name):
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    return mod
def install():
    _make_mock("triton")
'''
