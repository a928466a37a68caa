"""Ringmaster: elastic training for PyTorch with Horovod's API and torchrun's environment.

Training scripts import the user API: `import ringmaster.torch as hvd`. The rest of the
namespace is the service itself; README.md's layout section says where each part lives in
the repository (the folders are mapped under this namespace when installed).
"""

try:
    # Written by setuptools-scm at build and install time from git (pyproject.toml): the commit's own.
    from ringmaster._version import __version__
except ImportError:  # pragma: no cover - the source tree imported without being installed
    __version__ = "0.0.0+unknown"
